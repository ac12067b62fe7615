"""Class and distillation tokens and the absolute position embedding: torch-free rules.

Where the class token enters (at the input as ViT/DeiT, before a later block as ConViT and CaiT, or never),
the checks between ``tokens:`` and ``head:``, the parameters the tokens and the position embedding hold and
the memory of prepending them.  They are parameters of the model itself
(:class:`archspec.nn.model.ArchModel`: ``cls_token``, ``dist_token``, ``pos_embed``), not a module of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import StrictModel

__all__ = ["TokensSpec", "TokensPlan", "plan", "embed_params", "concat_memory", "NO_WEIGHT_DECAY"]

NO_WEIGHT_DECAY = frozenset({"pos_embed", "cls_token", "dist_token"})  # timm ViT's no_weight_decay()


class TokensSpec(StrictModel):
    """Extra tokens and the absolute position embedding."""

    cls_token: Literal["none", "input"] | int = Field(
        "input",
        description="'input': prepended before the first block (ViT/DeiT); 'none': no class token; "
        "an integer k: inserted before global block k (ConViT inserts it after its last GPSA block).",
    )
    dist_token: bool = Field(False, description="DeiT distillation token (needs head.distillation).")
    pos_embed: Literal["learned", "none"] = Field(
        "learned",
        description="Absolute learned position embedding added after the stem (covers the tokens present then)."
    )

    @field_validator("cls_token", mode="before")
    @classmethod
    def _none(cls, value: Any) -> Any:
        if value is None or value is False:
            return "none"
        if value is True:
            return "input"
        if isinstance(value, str) and value.strip() not in ("none", "input"):
            raise ValueError(f"cls_token must be 'input', 'none' or a block index (an integer >= 0), got {value!r}")
        if not isinstance(value, (str, int)):
            raise ValueError(f"cls_token must be 'input', 'none' or a block index (an integer >= 0), got {value!r}")
        return value.strip() if isinstance(value, str) else value

    @field_validator("cls_token")
    @classmethod
    def _non_negative(cls, value: Any) -> Any:
        if isinstance(value, int) and value < 0:
            raise ValueError("cls_token layer index must be >= 0")
        return value


@dataclass(frozen=True)
class TokensPlan:
    """Resolved ``tokens:``: extra tokens, where the class token enters (None: never), their width."""

    n_extra: int
    cls_at: int | None
    width: int


def plan(tokens: TokensSpec, pool: str, distillation: bool, depth: int, width_before: Callable[[int], int],
         first_dim: int) -> tuple[TokensPlan, list[tuple[tuple, str, str]]]:
    """Check ``tokens`` against the head (``pool``, ``distillation``) and the depth; where the class token enters.

    ``width_before(i)`` is the token width entering global block ``i``: a token inserted later has the width
    of the stage it enters (it is concatenated to that stage's tokens)."""
    n_extra = (tokens.cls_token != "none") + tokens.dist_token
    cls_at = 0 if tokens.cls_token == "input" else (None if tokens.cls_token == "none" else tokens.cls_token)
    out = []
    if cls_at is not None and cls_at > depth:
        out.append((("tokens", "cls_token"), f"class token inserted before block {cls_at}, but the model has "
                    f"{depth} blocks (0-{depth - 1})",
                    f"use an index from 0 to {depth} ({depth}: after the last block)"))
    if tokens.dist_token and cls_at is None:
        out.append((("tokens", "dist_token"), "a distillation token needs a class token",
                    "set tokens.cls_token: input"))
    if tokens.dist_token and not distillation:
        out.append((("tokens", "dist_token"), "a distillation token without a distillation head is unused",
                    "set head.distillation: true"))
    if pool == "cls" and cls_at is None:
        out.append((("head", "pool"), "pool: cls needs a class token", "set tokens.cls_token, or head.pool: mean"))
    if distillation and pool == "cls" and not tokens.dist_token:
        out.append((("head", "distillation"), "a distillation head with pool: cls reads the distillation token",
                    "set tokens.dist_token: true (DeiT), or head.pool: mean (LeViT)"))
    width = width_before(min(cls_at, depth)) if cls_at is not None else first_dim
    return TokensPlan(n_extra=n_extra, cls_at=cls_at, width=width), out


def embed_params(plan: TokensPlan, embed_len: int, dim: int, pos_embed: bool) -> int:
    """Parameters of the extra tokens (``width`` each) and of a position embedding over ``embed_len`` tokens."""
    return plan.n_extra * plan.width + (embed_len * dim if pos_embed else 0)


def concat_memory(n_in: int, n_out: int, dim: int, pos_embed: bool) -> NodeMemory:
    """Prepending class/distillation tokens (``torch.cat``: a new tensor) and adding the position embedding."""
    x_in, x_out = n_in * dim, n_out * dim
    copies = 2 if pos_embed else 1
    return NodeMemory(act=F32 * (x_in + copies * x_out), saved=F32 * copies * x_out)
