"""``build-env reproduce``: rebuild an image from the inputs it records, with no cache, and
compare the two file trees (:mod:`.compare`, pure; :mod:`.run`, the engine's part)."""
