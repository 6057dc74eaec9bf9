"""Attention implementations that plug into transformers models (CAB block-sparse attention).

Stage reached so far: the gathered block-sparse executor (:mod:`.block_sparse`), block scoring and
selection policies (:mod:`.selection`); the registered ``"cab"`` attention function comes next.
"""

from .block_sparse import block_sparse_attention, dense_masked_attention, selected_block_indices
