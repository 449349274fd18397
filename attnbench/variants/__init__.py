"""Built-in attention variants, registered in one explicit table (order = display order)."""

from attnbench.variants.base import Flops, Variant  # noqa: I001 - base before the registry
from attnbench.registry import register
from attnbench.variants.batched import BatchedAttention
from attnbench.variants.block_sparse import BlockSparseAttention
from attnbench.variants.chunked import ChunkedAttention
from attnbench.variants.linear import LinearElu, Performer
from attnbench.variants.local import LocalAttention
from attnbench.variants.loop import LoopAttention
from attnbench.variants.multihead import MultiheadAttentionCore
from attnbench.variants.scoring import ScoringAttention
from attnbench.variants.sdpa import SDPA
from attnbench.variants.torch_mha import TorchMHA
from attnbench.variants.vectorized import VectorizedAttention

BUILTINS = (
    ("loop", LoopAttention, {}),
    ("vectorized", VectorizedAttention, {}),
    ("batched", BatchedAttention, {}),
    ("multihead", MultiheadAttentionCore, {}),
    ("torch_mha", TorchMHA, {}),
    ("sdpa", SDPA, {"backend": "auto"}),
    ("sdpa_math", SDPA, {"backend": "math"}),
    ("sdpa_flash", SDPA, {"backend": "flash"}),
    ("sdpa_efficient", SDPA, {"backend": "efficient"}),
    ("sdpa_cudnn", SDPA, {"backend": "cudnn"}),
    ("chunked", ChunkedAttention, {}),
    ("local", LocalAttention, {}),
    ("block_sparse", BlockSparseAttention, {}),
    ("linear_elu", LinearElu, {}),
    ("performer", Performer, {}),
    ("dot", ScoringAttention, {"score": "dot"}),
    ("scaled_dot", ScoringAttention, {"score": "scaled_dot"}),
    ("bilinear", ScoringAttention, {"score": "bilinear"}),
    ("additive", ScoringAttention, {"score": "additive"}),
)

for _name, _cls, _defaults in BUILTINS:
    register(_name, _cls, **_defaults)

__all__ = ["Flops", "Variant", "BUILTINS"]
