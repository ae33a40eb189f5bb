"""What mccl is evaluated on: the papers' scenarios, the demo, plotting.

``mccl.experiments.scenarios`` (mccl-paper Fig. 2 and Fig. 9 on the flow-level
simulator, ``SCENARIOS`` by name), ``mccl.experiments.mccs`` (the MCCS ring
reversal), ``mccl.experiments.plotting`` (PNG plots of their reports) and
``mccl.experiments.demo`` (the closed loop live on gloo ranks). The core packages
never import this one; see README.md next to this file.
"""
