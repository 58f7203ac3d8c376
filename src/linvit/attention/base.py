"""The interface every attention operator implements.

An operator is a drop-in `attn_layer` for timm's VisionTransformer: it is constructed with timm's
keyword arguments, is called as `(x, attn_mask=None, is_causal=False)`, and keeps timm's parameter
names (`qkv`, `q_norm`, `k_norm`, `norm`, `proj`), so a softmax checkpoint's attention tensors map
one-to-one onto every operator. What differs between operators is only how heads mix tokens:

    global_mix(q, k, v)   -> (B, H, N, Dv)   the fast path used in training
    attention_map(q, k)   -> (B, H, N, N)    the explicit map with global_mix == map @ v
    local_mix(v)          -> (B, H, N, Dv)   optional token-local term (depthwise conv on V)

Parameters an operator adds beyond timm's are "operator-specific": no softmax checkpoint has them,
so init strategies always create them new (see linvit.transfer.init).

Numerics: under autocast (bf16 on CUDA, or on the CPU), a linear operator's `global_mix` and
`attention_map` run in float32, as each operator states where it defines them (the decorator
`float32_core`): sums over thousands of tokens lose too many bits in bf16, and some cores' fused
steps refuse mixed dtypes. Softmax does not: SDPA's fused kernels are built for bf16.
"""
from __future__ import annotations

import functools
import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

# Submodules that timm's Attention has; anything else in an operator is operator-specific.
SHARED_SUBMODULES = ("qkv", "q_norm", "k_norm", "norm", "proj")
# A depthwise conv padded by k // 2 keeps the grid only for odd k.
ODD_KERNEL = (lambda k: k > 0 and k % 2 == 1, "a positive odd integer")
# The operator families linear ViTs are built from (the README's table groups them so; `linvit
# bench` sets its goals per family).
FAMILIES = ("softmax", "feature map", "gated", "state space", "delta rule", "test-time training")

# What an operator's `attention_map` is. Map-level losses (cross-entropy against the teacher's
# softmax rows) are defined only for "stochastic" maps; the others are refused before compute.
MAP_KINDS = {
    "stochastic": "exact, every row non-negative and summing to 1",
    "signed": "exact (global_mix == map @ V) but signed or not row-normalised",
    "effective": "a linearised (effective) map: the layer is not linear in V given Q and K",
}


def float32_core(method=None, *, cast_back: bool = True):
    """Decorates an operator's `global_mix` (`@float32_core`) or `attention_map`
    (`@float32_core(cast_back=False)`): `method`(self, *tensors) computed in float32 with autocast
    off while autocast is on (the result cast back to the last input's dtype when `cast_back`);
    as it is otherwise."""
    if method is None:
        return functools.partial(float32_core, cast_back=cast_back)

    @functools.wraps(method)
    def run(self, *tensors):
        device = tensors[0].device.type
        if not torch.is_autocast_enabled(device):
            return method(self, *tensors)
        with torch.autocast(device, enabled=False):
            out = method(self, *(t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
                                 for t in tensors))
        return out.to(tensors[-1].dtype) if cast_back else out

    run.float32_core = True
    return run


def computes_in_float32(method) -> bool:
    """Whether an operator's method is a float32_core (the test of the autocast rule reads it)."""
    return bool(getattr(method, "float32_core", False))


class AttentionOperator(nn.Module):
    # The operator's registry key: linvit.attention.OPERATORS is keyed by these names.
    name: ClassVar[str] = ""
    # One of FAMILIES.
    family: ClassVar[str] = ""
    # Hyper-parameters a config may override (model.operator_options), with their defaults. Each
    # becomes a class attribute (self.kernel_size): declared here only, see __init_subclass__.
    options: ClassVar[dict] = {}
    # Per option, (predicate, what it demands); options without a rule must be finite and > 0.
    option_rules: ClassVar[dict] = {}
    # Whether attn_drop has a meaning (only operators that form a map during training).
    supports_attn_drop: ClassVar[bool] = False
    # One of MAP_KINDS: what `attention_map` returns (and so which distillation losses apply).
    map_kind: ClassVar[str] = "stochastic"
    # Why each operator-specific parameter starts where it does, by name prefix (a parameter's
    # local name, e.g. "gate_proj"): copied into copied.json beside every such new tensor.
    init_notes: ClassVar[dict[str, str]] = {}
    # The reference path is a token-by-token recurrence for some operators: `linvit bench` times
    # it only up to this many tokens (None: the reference scales like the fast path).
    reference_max_tokens: ClassVar[int | None] = None
    # The C++ kernels (linvit/ops/csrc/*.cpp; their headers follow by #include) its CPU path can
    # run: they join the code stamps of its jobs, so editing one reruns exactly its cells. A test
    # runs every operator and checks this against the kernel ops it called.
    cpp_sources: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        """Give the options a class declares their defaults as class attributes. Subclasses that
        only set attributes (linvit.attention.operator_class's overrides) keep theirs."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("options", {})
        twice = sorted(key for key in own if key in cls.__dict__)
        if twice:
            raise TypeError(f"{cls.__name__}: option(s) {twice} are set both in `options` and as "
                            "class attributes; declare the default once, in `options`")
        for key, default in own.items():
            setattr(cls, key, default)
        if cls.name and cls.family not in FAMILIES:
            raise TypeError(f"{cls.__name__}: family {cls.family!r} not one of {FAMILIES}")
        if cls.map_kind not in MAP_KINDS:
            raise TypeError(f"{cls.__name__}: map_kind {cls.map_kind!r} not one of "
                            f"{tuple(MAP_KINDS)}")
        own = {m: cls.__dict__[m] for m in ("global_mix", "attention_map") if m in cls.__dict__}
        if len({computes_in_float32(m) for m in own.values()}) > 1:
            raise TypeError(f"{cls.__name__}: global_mix and attention_map must both compute in "
                            "float32 under autocast (@float32_core) or neither")

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_norm: bool = False,
                 scale_norm: bool = False, proj_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, norm_layer: type[nn.Module] | None = None,
                 device=None, dtype=None, **unsupported) -> None:
        super().__init__()
        if unsupported:
            raise TypeError(f"{type(self).__name__}: unsupported timm attention options "
                            f"{sorted(unsupported)}")
        if dim % num_heads:
            raise ValueError(f"{self.name}: dim {dim} is not divisible by num_heads {num_heads}")
        if attn_drop and not self.supports_attn_drop:
            raise ValueError(f"{self.name}: attn_drop={attn_drop} has no meaning for an operator "
                             "that never forms its attention map; use proj_drop")
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("norm_layer is required with qk_norm or scale_norm")
        dd = {"device": device, "dtype": dtype}
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim, **dd) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        # Token layout, set by linvit.models.create_vit: prefix (cls/register) tokens come first,
        # then a row-major patch grid. Local terms need it; global mixing does not.
        self.num_prefix_tokens = 1
        self.grid_size: tuple[int, int] | None = None
        self.build(**dd)
        self.init_parameters()

    def init_weights(self) -> None:
        """timm's ViT init (init_weights_vit_timm, and the jax variant) gives every nn.Linear of
        the model its own init, the operator's gates and branches included, then calls this on
        their parent (children first): the operator's documented initial values win."""
        self.init_parameters()

    # --- what an operator implements -------------------------------------------------------
    def build(self, device=None, dtype=None) -> None:
        """Create operator-specific parameters (none by default); init_parameters sets them."""

    def init_parameters(self) -> None:
        """Set the operator-specific parameters to their documented initial values (init_notes);
        run after build and again after timm's init of the whole model. qkv and proj are not
        touched: they keep timm's init, or the copied teacher's tensors."""

    def global_mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def attention_map(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def local_mix(self, v: torch.Tensor) -> torch.Tensor | None:
        return None

    @classmethod
    def core_flops(cls, tokens: int, head_dim: int) -> float | None:
        """Floating-point operations of one head's `global_mix` forward on its fast path (a
        multiply-add counts 2; elementwise work ignored), for head dim d = Dk = Dv. `linvit bench`
        divides softmax's count by it: the speedup the operator would have at equal efficiency.
        None: not counted."""
        return None

    @classmethod
    def block_flops(cls, tokens: int, width: int, head_dim: int) -> float:
        """Forward FLOPs of the operator's own products outside qkv, proj and the heads' cores,
        for one image in one block (linvit.models.flops adds them to the model's count)."""
        return 0.0

    # --- shared machinery ------------------------------------------------------------------
    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)                                   # each (B, H, N, d)
        return self.q_norm(q), self.k_norm(k), v

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """How heads mix tokens, (B, H, N, d) -> (B, H, N, d): all of the operator but the
        projections every operator shares (what `linvit bench` times)."""
        out = self.global_mix(q, k, v)
        local = self.local_mix(v)
        return out if local is None else out + local

    def _forward(self, x: torch.Tensor, need_map: bool):
        B, N, C = x.shape
        q, k, v = self.project(x)
        out = self.mix(q, k, v)
        attn_map = self.attention_map(q, k) if need_map else None
        out = out.transpose(1, 2).reshape(B, N, C)
        out = self.proj_drop(self.proj(self.norm(out)))
        return out, attn_map

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError(f"{self.name} attention is bidirectional: attn_mask and is_causal "
                             "are not supported")
        return self._forward(x, need_map=False)[0]

    def forward_with_map(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Output and the (B, H, N, N) float32 map that multiplies V (before any local term)."""
        return self._forward(x, need_map=True)

    @staticmethod
    def merge_heads(t: torch.Tensor) -> torch.Tensor:
        """(B, H, N, d) -> (B, N, H*d): all heads of a token, e.g. for a gate projection.
        Gates read the keys k = W_k x rather than x: for timm's square, generically invertible
        W_k that is the same family of functions of x, and it keeps mix(q, k, v) self-contained."""
        B, H, N, d = t.shape
        return t.transpose(1, 2).reshape(B, N, H * d)

    def operator_specific_parameters(self) -> list[str]:
        return [n for n, _ in self.named_parameters() if n.split(".")[0] not in SHARED_SUBMODULES]

    def init_note(self, parameter: str) -> str:
        """The declared reason for an operator-specific parameter's init (longest matching
        prefix of `init_notes`), or "" when the operator declares none."""
        matches = [p for p in self.init_notes if parameter.startswith(p)]
        return self.init_notes[max(matches, key=len)] if matches else ""

    # --- token layout helpers for local terms ----------------------------------------------
    def set_token_layout(self, num_prefix_tokens: int, grid_size: tuple[int, int] | None) -> None:
        self.num_prefix_tokens = num_prefix_tokens
        self.grid_size = tuple(grid_size) if grid_size is not None else None

    def patch_grid(self, num_tokens: int) -> tuple[int, int]:
        n = num_tokens - self.num_prefix_tokens
        if self.grid_size is not None and self.grid_size[0] * self.grid_size[1] == n:
            return self.grid_size
        side = math.isqrt(max(n, 0))
        if side * side != n:
            raise ValueError(f"{self.name}: cannot place {n} patch tokens on a grid (prefix "
                             f"tokens {self.num_prefix_tokens}, grid {self.grid_size}); call "
                             "set_token_layout with the current grid")
        return side, side

    def depthwise_on_patches(self, v: torch.Tensor, conv: nn.Module,
                             per_head: bool) -> torch.Tensor:
        """Apply a depthwise conv over the patch grid of V; prefix tokens get a zero local term.

        per_head=True shares one conv of head_dim channels across heads (FLatten); otherwise the
        conv has H*d channels (one filter per channel of every head).
        """
        B, H, N, d = v.shape
        h, w = self.patch_grid(N)
        p = self.num_prefix_tokens
        # (B, h, w, H*d) memory seen as NCHW, i.e. channels-last: oneDNN runs depthwise convs
        # several times faster than NCHW (backward especially). A conv shared by the heads
        # runs as one conv over all H*d channels with its filters repeated per head (autograd
        # sums the repeats' gradients back), the same maths without a (B*H)-batch layout.
        grid = v[:, :, p:].permute(0, 2, 1, 3).reshape(B, h, w, H * d).permute(0, 3, 1, 2)
        weight, bias = conv.weight, conv.bias
        if per_head:
            weight = weight.repeat(H, 1, 1, 1)
            bias = bias.repeat(H) if bias is not None else None
        out = F.conv2d(grid, weight, bias, conv.stride, conv.padding, conv.dilation, H * d)
        out = out.permute(0, 2, 3, 1).reshape(B, h * w, H, d).permute(0, 2, 1, 3)
        return torch.cat([torch.zeros_like(v[:, :, :p]), out], dim=2)
