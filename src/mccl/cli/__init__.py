"""The ``mccl`` command line: topo, synth, eval, sim."""
