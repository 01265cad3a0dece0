"""The paths ``build-env reproduce`` does not compare, as data: each with the reason it is not
part of what the build made (docs/reproduce.md lists them). Patterns are :mod:`fnmatch` globs
over absolute paths; a pattern ending in ``/**`` covers everything below a directory (not the
directory itself).
"""

from __future__ import annotations

IGNORED: tuple[tuple[str, str], ...] = (
    ("/.dockerenv", "the engine creates it in every container, the export's included; the "
                    "image has none"),
    ("/etc/hostname", "a mount point the engine creates for the container's hostname file; "
                      "empty in the image"),
    ("/etc/hosts", "a mount point the engine creates for the container's hosts file"),
    ("/etc/resolv.conf", "a mount point the engine creates for the container's DNS settings"),
    ("/etc/mtab", "the engine's init layer links it to /proc/mounts in every container"),
    ("/dev/**", "device nodes and mount points of the container's /dev, made by the engine"),
    ("/proc/**", "the container's procfs mount point"),
    ("/sys/**", "the container's sysfs mount point"),
)
