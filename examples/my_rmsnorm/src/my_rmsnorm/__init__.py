"""An example kernelbench plugin: Triton kernels (``my_rmsnorm.kernels``) and their registration
with kernelbench (``my_rmsnorm.plugin``, found through the ``kernelbench.plugins`` entry point)."""
