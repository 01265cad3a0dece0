"""From pins to a lock (pure core, plus ``uv`` as a subprocess): the site and its targets, the
metadata snapshot and the cross-package check, the full lock with its recorded header, install
layers, source and prebuilt records, vendor bases."""
