"""mccl.runtime (see api)."""
