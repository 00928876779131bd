"""One frozen base model per process, shared by rollout engines and trainers, with many LoRA adapters.

A population is many adapters on one base. Loading the base once per component would multiply the
largest allocation of a run, so the ``hf`` engine and the trainers ask :func:`get_host` for the
process-wide :class:`ModelHost` of a base model and only add adapters to it. Adapters are addressed
by immutable version names (``s0@v3``): a version is loaded from its PEFT directory once as plain
tensors, kept in an LRU set, and never modified; trainers work in a private PEFT ``scratch`` slot and
write each new version to a new directory. torch, transformers and peft are imported inside functions only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from ..api.components import AdapterRef, BaseModel
from ..api.errors import UserError, run_all
from ..api.lora import LoraWeights
from .adapters import SHAPE_KEYS, config_difference, from_state_dict, load_lora, save_lora
from .device import load_kwargs, resolve_device, resolve_dtype

#: A PEFT slot serves another adapter only when it has the same shape and the same dropout (trainers use it).
_SLOT_KEYS = (*SHAPE_KEYS, "lora_dropout")


class ModelHost:
    """The shared base model, its tokenizer and the PeftModel holding every loaded adapter.

    Served versions (``ensure``/``version``) are plain tensors keyed by version name; PEFT holds only
    pinned slots (``slot``/``load_into``: the trainers' scratch and reference adapters, ``create``).
    """

    def __init__(self, base: BaseModel, device: str = "auto") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.base = base
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(base.dtype, self.device)
        self.lock = threading.RLock()
        path = Path(base.path)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(base.path)
            model: Any = AutoModelForCausalLM.from_pretrained(base.path, **load_kwargs(self.device, self.dtype))
        except OSError as exc:
            where = "directory" if path.exists() else "path (not found)"
            raise UserError(f"base_model.path: cannot load model {base.path!r} from {where}: {exc}") from None
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        model.to(self.device)
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.base_model: Any = model
        self.peft: Any = None  # PeftModel, created with the first adapter
        self.capacity = 32  # version names kept loaded (LRU); engines may raise it
        # served versions: served key -> (version name, tensors)
        self._versions: OrderedDict[str, tuple[str, dict[str, tuple[Any, Any]]]] = OrderedDict()
        self._linear_cache: dict[str, Any] | None = None
        self._configs: dict[str, dict[str, Any]] = {}  # PEFT key -> adapter config
        self._torch = torch
        self._mode_lock = threading.Lock()
        self.mode: str | None = None  # what the base is configured for: "serving", "training" or None
        self._mode_depth = 0  # open blocks of the mode (serving: one per thread that generates)
        self._undo: list[Callable[[], None]] = []  # what the outermost block restores, last first
        self._setting: Any = None  # what the open mode was configured with (nested blocks must match)

    # --- modes: what the shared base is configured for ------------------------------------------

    @contextmanager
    def serving(self, row_hook: Callable[..., Any], *, attention: str | None = None) -> Iterator[None]:
        """Within the block (re-entrant, from any thread) the base serves generation: PEFT's slots are off, every
        base linear carries the forward hook ``row_hook`` (an engine's per-row adapter deltas) and, when given,
        the attention layers use ``attention`` (a name registered with transformers' ``AttentionInterface``),
        configured by the outermost block. Serving while a training block is open, or a nested block asking for
        another hook or attention, is an error, not a race on one model."""

        def configure() -> None:
            disable = self.peft.disable_adapter() if self.peft is not None else nullcontext()
            disable.__enter__()
            self._undo.append(lambda: disable.__exit__(None, None, None))
            for linear in self.linears():
                self._undo.append(linear.register_forward_hook(row_hook).remove)
            if attention is not None:
                config = self.base_model.config
                before = config._attn_implementation
                config._attn_implementation = attention
                self._undo.append(lambda: setattr(config, "_attn_implementation", before))

        with self._mode_lock:
            self._enter("serving", configure, setting=(row_hook, attention))
        try:
            yield
        finally:
            self._leave()

    @contextmanager
    def training(
        self, *, checkpointing: bool = False, layer_forward: Callable[[Any], Callable[..., Any] | None] | None = None
    ) -> Iterator[Any]:
        """Within the block the yielded PeftModel trains, with gradient checkpointing (a flag transformers honours
        in train mode only) on when asked; at the end the model goes back to eval and checkpointing off again
        (with the input-grad hook transformers adds), so generation never sees it. ``layer_forward(layer)``: for
        each PEFT LoRA layer, a forward to use instead of PEFT's within the block (None: PEFT's), e.g. a
        trainer's fused LoRA product; the host installs and removes them. A training block while a serving or
        another training block is open is an error."""
        if self.peft is None:
            raise RuntimeError("ModelHost.training: no adapter slot to train (create one with slot())")
        model, base = self.peft, self.base_model

        def configure() -> None:
            had_hooks = bool(getattr(base, "_require_grads_hooks", None))
            if checkpointing:
                try:
                    # use_reentrant=False: gradients reach the LoRA factors although no input requires grad
                    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                except ValueError as exc:
                    raise UserError(f"trainer.gradient_checkpointing: {exc}; set it to off") from None

                def off() -> None:
                    base.gradient_checkpointing_disable()
                    if not had_hooks and getattr(base, "_require_grads_hooks", None):
                        base.disable_input_require_grads()

                self._undo.append(off)
            self._undo.append(model.eval)
            model.train()
            if layer_forward is not None:
                self._install_layer_forwards(model, layer_forward)

        with self._mode_lock:
            self._enter("training", configure, reentrant=False)
        try:
            yield model
        finally:
            self._leave()

    def _install_layer_forwards(self, model: Any, layer_forward: Callable[[Any], Callable[..., Any] | None]) -> None:
        """Each LoRA layer's forward from ``layer_forward`` (None: PEFT's stays), removed when the block ends."""

        def remove(layer: Any) -> Callable[[], None]:
            return lambda: delattr(layer, "forward")  # the class's (PEFT's) forward again

        for layer in [m for m in model.modules() if hasattr(m, "lora_A")]:
            forward = layer_forward(layer)
            if forward is not None:
                layer.forward = forward
                self._undo.append(remove(layer))

    def _enter(self, mode: str, configure: Callable[[], None], reentrant: bool = True, setting: Any = None) -> None:
        """One more block of ``mode`` (under the mode lock); the outermost runs ``configure``, which queues its
        restores in ``_undo``; a nested one must ask for the outermost's ``setting``. A configuration that fails
        is undone as far as it got, and the block is not open."""
        if self.mode is not None and (self.mode != mode or not reentrant):
            raise RuntimeError(
                f"ModelHost: a {mode} block while a {self.mode} block is open on the same base model "
                "(generation and training take turns; the engine's generate and the trainer's update never overlap)"
            )
        if self.mode is not None and setting != self._setting:
            raise RuntimeError(
                f"ModelHost: a nested {mode} block asks for {setting!r}, the open one is configured for "
                f"{self._setting!r}"
            )
        self.mode, self._setting = mode, setting
        self._mode_depth += 1
        if self._mode_depth > 1:
            return
        try:
            configure()
        except BaseException:
            self._mode_depth = 0
            self._restore()
            raise

    def _leave(self) -> None:
        with self._mode_lock:
            self._mode_depth -= 1
            if not self._mode_depth:
                self._restore()

    def _restore(self) -> None:
        """The queued restores, last first, every one even if another fails (the first failure is raised after)."""
        self.mode = None
        undo, self._undo = self._undo, []
        run_all(reversed(undo))

    # --- model access ---------------------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The PeftModel once an adapter exists, else the bare base model."""
        return self.peft if self.peft is not None else self.base_model

    def eos_token_ids(self) -> list[int]:
        eos = getattr(self.base_model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        ids = eos if isinstance(eos, list) else [eos]
        return [int(i) for i in ids if i is not None]

    # --- adapters -------------------------------------------------------------------------------

    def _add_slot(self, key: str, config: dict[str, Any]) -> None:
        from peft import LoraConfig, get_peft_model

        fields = {k: v for k, v in config.items() if k in LoraConfig.__dataclass_fields__}
        fields["target_modules"] = list(config.get("target_modules") or [])
        fields["inference_mode"] = True
        cfg = LoraConfig(**fields)
        if self.peft is None:
            self.peft = get_peft_model(self.base_model, cfg, adapter_name=key)
            self.peft.eval()
        else:
            self.peft.add_adapter(key, cfg)
        self._configs[key] = dict(config)
        for name, p in self.peft.named_parameters():  # add_adapter marks new LoRA params trainable
            if f".{key}." in name:
                p.requires_grad_(False)

    def _load_weights(self, key: str, weights: LoraWeights, path: Path) -> None:
        from peft import set_peft_model_state_dict

        tensors = weights.state_dict()
        result = set_peft_model_state_dict(self.peft, tensors, adapter_name=key)
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if ".lora_" in k]
        if unexpected:
            raise UserError(f"{path}: adapter does not fit base model {self.base.path!r} (e.g. {unexpected[0]})")
        expected = {k for k in self.state_dict(key)}
        if not expected.issubset(tensors):
            missing = sorted(expected - set(tensors))[:1]
            raise UserError(f"{path}: adapter lacks tensors for {missing}")

    def ensure(self, ref: AdapterRef) -> str:
        """Load version ``ref`` from ``ref.path`` on first use (LRU); returns its key for :meth:`version`.

        The key is :attr:`AdapterRef.served_key` (name and path, so two runs in one process never share one).
        Served versions are plain tensors, not PEFT modules: ``{linear module path: (A, scale * B)}``
        in float32 on the model's device. PEFT keeps ~10 kB of Python module objects per LoRA module
        and adapter, which dominated memory for small adapters; and the engines' batched mixed-adapter
        forward needs only the tensors (see populora_engines.batched_lora).
        """
        key = ref.served_key
        with self.lock:
            if key in self._versions:
                self._versions.move_to_end(key)
                return key
            self._versions[key] = (ref.name, self._read_version(Path(ref.path)))
            self._evict()
            return key

    def linear(self, path: str) -> Any:
        """The base ``nn.Linear`` at ``path`` (inside PEFT's wrapper when the module is wrapped)."""
        module = self._linears().get(path)
        if module is None:
            raise KeyError(path)
        return module

    def linears(self) -> list[Any]:
        """Every base ``nn.Linear`` (inside PEFT's wrapper when wrapped), e.g. for hooks on all of them."""
        return list(self._linears().values())

    def _linears(self) -> dict[str, Any]:
        torch = self._torch
        if self._linear_cache is None:
            found = {}
            for name, module in self.base_model.named_modules():
                if isinstance(module, torch.nn.Linear):
                    found[name[: -len(".base_layer")] if name.endswith(".base_layer") else name] = module
            self._linear_cache = found
        return self._linear_cache

    def _read_version(self, path: Path) -> dict[str, tuple[Any, Any]]:
        weights = load_lora(path)
        if weights.config.get("use_dora") or weights.config.get("lora_bias"):
            raise UserError(f"{path}: DoRA / LoRA bias adapters are not supported for serving")
        linears = self._linears()
        out: dict[str, tuple[Any, Any]] = {}
        for name, f in weights.items():
            a, b = f.A, f.B
            module_path = name[len("base_model.model.") :] if name.startswith("base_model.model.") else name
            linear = linears.get(module_path)
            if (
                linear is None
                or a.shape[1] != linear.in_features
                or b.shape[0] != linear.out_features
                or a.shape[0] != b.shape[1]
            ):
                raise UserError(f"{path}: adapter does not fit base model {self.base.path!r} (at {module_path})")
            dev = linear.weight.device
            # copies: load_file's tensors may share one buffer; a view kept alive would keep it all
            out[module_path] = (
                a.to(dev, self._torch.float32, copy=True),
                (b.to(self._torch.float32) * f.scale).to(dev),
            )
        return out

    def version(self, key: str) -> dict[str, tuple[Any, Any]]:
        """The tensors of a loaded version (``key`` from :meth:`ensure`): ``{module path: (A (r, d_in),
        scale * B (d_out, r))}``."""
        return self._versions[key][1]

    def drop(self, name: str) -> None:
        """Forget every loaded version named ``name`` (a no-op when none is loaded)."""
        with self.lock:
            for key in [k for k, (n, _) in self._versions.items() if n == name]:
                del self._versions[key]

    def _delete(self, key: str) -> None:
        self._configs.pop(key, None)
        if self.peft is not None and key in self.peft.peft_config:
            if len(self.peft.peft_config) == 1:
                return  # PEFT cannot hold zero adapters; the slot stays until replaced
            self.peft.delete_adapter(key)

    def _evict(self) -> None:
        while len(self._versions) > max(1, self.capacity):
            self._versions.popitem(last=False)

    def slot(self, key: str, config: dict[str, Any]) -> str:
        """A private, pinned adapter slot (trainers' ``scratch``, reference adapters) of this shape."""
        with self.lock:
            old = self._configs.get(key)
            if old is not None and config_difference(old, config, _SLOT_KEYS) is not None:
                if self.peft is not None and len(self.peft.peft_config) == 1:
                    self._add_slot(key + "_tmp", config)  # keep PEFT non-empty while replacing
                    self.peft.delete_adapter(key)
                    self._configs.pop(key, None)
                    self._add_slot(key, config)
                    self.peft.delete_adapter(key + "_tmp")
                    self._configs.pop(key + "_tmp", None)
                else:
                    self._delete(key)
                    self._add_slot(key, config)
            elif old is None:
                self._add_slot(key, config)
            self._configs[key] = dict(config)
            return key

    def load_into(self, key: str, ref: AdapterRef) -> dict[str, Any]:
        """Copy version ``ref`` into slot ``key`` (created or reshaped as needed); returns its config."""
        with self.lock:
            path = Path(ref.path)
            weights = load_lora(path)
            self.slot(key, weights.config)
            self._load_weights(key, weights, path)
            return weights.config

    def params(self, key: str) -> dict[str, Any]:
        """``{peft-independent name: Parameter}`` of one adapter, sorted, the key stripped from names."""
        out = {}
        for name, p in self.peft.named_parameters():
            if f".{key}." in name:
                out[name.replace(f".{key}.", ".")] = p
        return dict(sorted(out.items()))

    def state_dict(self, key: str) -> dict[str, Any]:
        """The adapter's tensors with PEFT's on-disk key names."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.peft, adapter_name=key)

    def save(
        self, key: str, out_dir: str | Path, config: dict[str, Any] | None = None, *, served_dtype: str | None = None
    ) -> Path:
        """Write slot ``key`` as a new PEFT directory (atomic; refuses to overwrite a version), in fp32, plus its
        copy in ``served_dtype`` when given (populora_core.services.adapters.served_copy)."""
        with self.lock:
            config = dict(config if config is not None else self._configs[key])
            config["inference_mode"] = True
            tensors = {k: v.detach().to("cpu", self._torch.float32).clone() for k, v in self.state_dict(key).items()}
            weights = from_state_dict(tensors, config, where=f"adapter slot {key}")
            return save_lora(weights, out_dir, served_dtype=served_dtype)


_HOSTS: dict[tuple[str, str, str], ModelHost] = {}
_HOSTS_LOCK = threading.Lock()


def get_host(base: BaseModel, device: str = "auto") -> ModelHost:
    """The process-wide host of ``base`` (created on first use): one copy of the base per process."""
    dev = resolve_device(device)
    key = (str(Path(base.path).expanduser()), base.dtype, dev)
    with _HOSTS_LOCK:
        host = _HOSTS.get(key)
        if host is None:
            host = ModelHost(base, dev)
            _HOSTS[key] = host
        return host


def release_hosts() -> None:
    """Forget every process-wide host, so the next :func:`get_host` loads its base again (a benchmark measuring
    each variant's own peak); a host still referenced lives on with its users."""
    with _HOSTS_LOCK:
        _HOSTS.clear()
