"""Training: MTP head data, training and metrics (self-distillation), and draft-model distillation."""
