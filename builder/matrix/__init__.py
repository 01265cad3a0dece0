"""The reviewed matrix as a typed model (pure): loading and validating ``matrix.yaml``, the
grammar of every string that reaches a template, accelerator families, reviewed overrides, the
Megatron layer and image names. Nothing here touches the network, the engine or the disk
beyond reading the matrix."""
