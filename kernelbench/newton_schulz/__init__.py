"""Newton-Schulz orthogonalisation (Muon's inner iteration) in Triton: classic and Hopper paths.

    from kernelbench.newton_schulz import newton_schulz
    X = newton_schulz(G, steps=5, path="auto")   # newton_schulz.last_path / .last_graph: what ran

One concern per file: ``routing.py`` (the entry point, routes, CUDA graphs, the reference),
``host.py`` (tile configurations, launches, the iteration), ``kernels.py`` (the Triton kernels).
Importing this package defines Triton kernels: set TRITON_INTERPRET=1 first on a machine
without a GPU.
"""

from .routing import (
    NS_COEFFICIENTS,
    choose_path,
    choose_route,
    clear_graph_cache,
    graph_static_bytes,
    newton_schulz,
    newton_schulz_ref,
)

__all__ = ["NS_COEFFICIENTS", "choose_path", "choose_route", "clear_graph_cache", "graph_static_bytes", "newton_schulz",
           "newton_schulz_ref"]
