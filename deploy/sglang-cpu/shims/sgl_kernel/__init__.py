"""TEST-ENVIRONMENT SHIM standing in for ``sgl_kernel`` (deploy/sglang-cpu/README.md).

The CPU build of sgl_kernel is not published, and SGLang imports a few of its names
unconditionally on its CPU path.  For a dense Qwen2 with ``--attention-backend
torch_native`` none of those kernels runs, so this stand-in only satisfies the imports:
each name listed below is a function that raises :class:`ShimKernelCalled` when called.
Any other name is missing (ImportError), so SGLang's own ``try: ... except ImportError``
fallbacks still take over.  A test that passes with this shim proves SGLang's own torch
code computed every token.
"""

from __future__ import annotations

from sgl_kernel._placeholder import ShimKernelCalled, define

__version__ = "0.0.0+temper.shim"
__all__ = ["ShimKernelCalled"]

#: Names SGLang 0.5.23 imports from ``sgl_kernel`` at start-up on the CPU path.
_IMPORTED_AT_START_UP = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
)

define(globals(), __name__, _IMPORTED_AT_START_UP)
