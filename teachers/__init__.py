"""Teachers: disjoint partitions of the private data, teacher models, vectorised ensemble
training, resumable Ray orchestration, and the ensemble's votes on the public pool."""
