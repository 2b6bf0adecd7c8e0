"""Where each region of the all2all symmetric buffer sits (the same on every rank), in bytes; a row per (token,
destination rank) each way, M = max_num_tokens rows at most from each source (kernels/all2all/cuda/fused.cuh):

    [0, FLAG_BYTES)  flags: words 0..7 dispatch flags by source, 8..15 return flags by destination
    count   int32 [ws]          rows each source sent here this call
    tok     int32 [ws][M]       the source's token id of each received row
    x       fp16  [ws][M][H]    the rows each source sent here
    ret     fp16  [ws][M][H]    y returned to this rank, by destination rank and token
"""
from typing import NamedTuple

FLAG_BYTES = 4096
ALIGN = 256


class Layout(NamedTuple):
    M: int
    off_count: int
    off_tok: int
    off_x: int
    off_ret: int
    nbytes: int

    def offsets(self) -> list[int]:
        return [self.M, self.off_count, self.off_tok, self.off_x, self.off_ret]


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout(world_size: int, max_num_tokens: int, hidden_dim: int) -> Layout:
    M = max_num_tokens
    off_count = FLAG_BYTES
    off_tok = _up(off_count + 4 * world_size)
    off_x = _up(off_tok + 4 * world_size * M)
    off_ret = _up(off_x + 2 * world_size * M * hidden_dim)
    return Layout(M, off_count, off_tok, off_x, off_ret, _up(off_ret + 2 * world_size * M * hidden_dim))
