"""What a plugin registers: its params model (:class:`Params`, :class:`NoParams`) and the :class:`Component` record
the registry keeps for it; :func:`format_validation_error`, the one-line form of a params error.

The registry itself (:mod:`populora_core.plugin.registry`) is private: plugins reach it through ``register`` and
:func:`populora_core.api.get_registry`.
"""

from __future__ import annotations

import difflib
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import TypedDict  # pydantic validates typing's only from Python 3.12

from .errors import UserError


class Params(BaseModel):
    """Base of every component's params model: unknown keys are errors, values are checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    """Params model of a component that takes none."""


class Meta(TypedDict, total=False):
    """What a ``register(name, factory, params=..., description=...)`` call may declare besides, each for the kinds
    :data:`populora_core.plugin.registry.KEYWORDS` names: an unknown keyword, or a value of another type, is a
    :class:`PluginError` when the plugin loads (the hookspecs say what each means)."""

    doctor: Callable[[], tuple[str, str, str | None]]  # any kind: a row of `populora doctor`
    memory: Callable[[Any, Any], Any]  # engine, trainer: its GPU memory terms for `populora plan`
    sampling_logprobs: Callable[[Any], bool]  # trainer: whether its updates read the sampling policy's log-probs
    gpus: Callable[[Any], int]  # cluster: the GPUs its members are spread over
    min_parents: int  # operator: the fewest parents it takes (required)
    max_parents: int | None  # operator: the most (None: no bound)
    category: str  # evaluator: what its answers are ("code", "math"), as its `category` attribute says


@dataclass(frozen=True)
class Component:
    """One registered component. ``factory`` is what the kind's contract says (see hookspecs)."""

    kind: str
    name: str
    factory: Callable[..., Any]
    params_model: type[Params]
    plugin: str
    version: str
    description: str = ""
    meta: Meta = field(default_factory=lambda: Meta())

    def parse_params(self, raw: dict[str, Any] | None) -> Params:
        """Validate ``raw`` against this component's params model (raises pydantic's error)."""
        return self.params_model.model_validate(raw or {})

    def build(self, raw_params: dict[str, Any] | Params | None = None, **context: Any) -> Any:
        """Validate the params and call the factory with the context arguments it declares.

        The core only ever adds context arguments (a task factory receives ``tasks`` since it was added);
        a factory that does not name one, and takes no ``**kwargs``, is not handed it.
        """
        if isinstance(raw_params, Params):
            params = raw_params
        else:
            try:
                params = self.parse_params(raw_params)
            except ValidationError as err:
                why = format_validation_error(err, model=self.params_model)
                raise UserError(f"{self.kind} {self.name!r} (plugin {self.plugin}): {why}") from None
        return self.factory(params, **accepted_arguments(self.factory, context))


def _model_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model a location's parent mapping is validated by (through lists and optionals), if any."""
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        candidates += [arg for c in list(candidates) for arg in typing.get_args(c)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def format_validation_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """One line per pydantic error, each naming its dotted path under ``prefix``. With the ``model`` that
    raised it, an unknown key says the key it is close to, or the keys there are."""
    lines = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"])
        path = ".".join(p for p in (prefix, loc) if p)
        kind = item["type"]
        msg = "unknown key" if kind == "extra_forbidden" else item["msg"]
        parent = _model_at(model, tuple(item["loc"][:-1])) if kind == "extra_forbidden" and item["loc"] else None
        if parent is not None:
            known = sorted(parent.model_fields)
            close = difflib.get_close_matches(str(item["loc"][-1]), known, n=1)
            msg += f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(known)})"
        lines.append(f"{path}: {msg}" if path else msg)
    return "; ".join(lines)


def accepted_arguments(factory: Callable[..., Any], context: dict[str, Any]) -> dict[str, Any]:
    """The part of ``context`` that ``factory``'s signature takes (all of it with ``**kwargs``)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no introspectable signature: hand everything over
        return context
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return context
    names = {p.name for p in parameters}
    return {k: v for k, v in context.items() if k in names}


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""
