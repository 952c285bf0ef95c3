"""The design space applied to a model: the genotype (`config`), named presets, injection into a
transformers model, exact counts, the task head, precision, the PETL modules and the backbone specs.
Imports nothing above it: no tasks, training, optuna or ray."""
