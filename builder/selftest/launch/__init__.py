"""How the self-test runs: the launcher's rank facts, the phase worker subprocess, the local and distributed rank processes, and the Slurm job's helper commands."""
