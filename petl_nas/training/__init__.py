"""Training one configuration: the loop, its checkpoints, compiling and CUDA graphs, the step
clock, frozen-layer reuse, the costs a trial measures, and loading a backbone and its data for a task."""
