"""Where each region of the all2all symmetric buffer sits (the same on every rank), in bytes:

    [0, FLAG_BYTES)  flags: words 0..7 dispatch flags by source, 8..15 combine flags by destination
    count   int32 [ws]          pairs each source sent here this call
    pair    int32 [ws][P]       the source's pair id (t*K + k) of each received slot
    x       fp16  [ws][P][H]    the rows each source sent here
    ret     fp16  [P][H]        expert outputs returned to this rank, by its own pair id
P = max_num_tokens * experts_per_token: a source can send every pair of every token to one rank.

`fused_layout` is the one-launch path's (fused.cuh): a row per (token, destination rank), M = max_num_tokens:
    count   int32 [ws]          rows each source sent here this call
    tok     int32 [ws][M]       the source's token id of each received row
    x       fp16  [ws][M][H]    the rows each source sent here
    ret     fp16  [ws][M][H]    y returned to this rank, by destination rank and token
Its offsets fill the same five places (M for P, tok for pair).
"""
from typing import NamedTuple

FLAG_BYTES = 4096
ALIGN = 256


class Layout(NamedTuple):
    P: int
    off_count: int
    off_pair: int
    off_x: int
    off_ret: int
    nbytes: int

    def offsets(self) -> list[int]:
        return [self.P, self.off_count, self.off_pair, self.off_x, self.off_ret]


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout(world_size: int, max_num_tokens: int, experts_per_token: int, hidden_dim: int) -> Layout:
    P = max_num_tokens * experts_per_token
    off_count = FLAG_BYTES
    off_pair = _up(off_count + 4 * world_size)
    off_x = _up(off_pair + 4 * world_size * P)
    off_ret = _up(off_x + 2 * world_size * P * hidden_dim)
    return Layout(P, off_count, off_pair, off_x, off_ret, _up(off_ret + 2 * P * hidden_dim))


def fused_layout(world_size: int, max_num_tokens: int, hidden_dim: int) -> Layout:
    M = max_num_tokens
    off_count = FLAG_BYTES
    off_tok = _up(off_count + 4 * world_size)
    off_x = _up(off_tok + 4 * world_size * M)
    off_ret = _up(off_x + 2 * world_size * M * hidden_dim)
    return Layout(M, off_count, off_tok, off_x, off_ret, _up(off_ret + 2 * world_size * M * hidden_dim))
