"""Benchmarks of issue 6: each figure measures kubetrain against a real baseline program run
in the same process tree, on the same machine, in the same run (``make bench``)."""
