"""The OCI distribution API: the registry client every edge that talks to a registry uses."""
