"""The learner's engine: Tensor, Function (an op's forward and backward on raw arrays), the tape (entries,
graphs, the backward loop) and the observer list tools watch it through. Read in that order."""
