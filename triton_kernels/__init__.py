"""packkit's Triton kernels, installed as ``packkit.triton_kernels`` (never a top-level module).

The pack kernels land here with the "Pack ops" work; the planner needs none.
"""
