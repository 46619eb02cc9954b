"""CUDA memory snapshots and memory timelines, read without unpickling arbitrary objects."""
