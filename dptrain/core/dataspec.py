"""What a data set's rows look like, from its public schema alone: the value the data layer
describes and the models layer reads (both import it from here, so neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DataSpec"]


@dataclass(frozen=True)
class DataSpec:
    """What a data set's rows look like, from its public schema: the number of input features
    and the kind of target: "binary" (0/1 labels as float32), "multiclass" (int64 indices into
    ``class_names``, the declared class list) or "continuous" (float32, scaled to [0, 1] by the
    declared public ``target_bounds`` (lower, upper))."""

    n_features: int
    target_kind: str = "binary"
    class_names: tuple[str, ...] = ()
    target_bounds: tuple[float, float] | None = None

    @property
    def n_classes(self) -> int:
        return len(self.class_names) if self.target_kind == "multiclass" else (2 if self.target_kind == "binary" else 0)
