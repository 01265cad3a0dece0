"""Known vulnerabilities per image: every installed Python distribution (read from the image's
installed metadata, :mod:`builder.audit.installed`) matched against an offline OSV database (the
PyPI ``all.zip`` OSV publishes, or its unpacked directory: :mod:`builder.audit.osv`), the result
as one document (:mod:`builder.audit.result`) that is printed, recorded locally beside the
verdicts and, by ``publish --audit``, signed and attached to the image as a referrer."""
