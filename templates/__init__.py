"""Operator templates: conv2d, depthwise conv2d, dense.

Each template is one loop nest written with the IR builder over logical tensors (NCHW activations, OIHW
weights); the config's scopes and layouts are buffer declarations, so one definition yields texture and
buffer kernels. ``TEMPLATES[name]`` bundles what the tuner needs:

    t = get_template("conv2d")
    wl = t.workload(data=(1, 64, 56, 56), kernel=(64, 64, 3, 3), padding=1)
    cfg = t.fallback(wl, device.info)          # good without tuning, from the device's capabilities
    exe = build(t.build(wl, cfg), device)
    inputs = t.random_inputs(wl, rng)
    y = exe(**inputs)[t.output]                # compare with t.reference(wl, inputs)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tuner.errors import TunerError


@dataclass(frozen=True)
class Template:
    name: str
    workload: type  # frozen dataclass: the canonical key (``.key()``, ``.flops``, ``.out_shape``)
    config: type  # frozen dataclass: one value per knob of the search space
    build: Callable  # (workload, config) -> Kernel | Program
    reference: Callable  # (workload, inputs: dict) -> float64 ndarray of the output
    random_inputs: Callable  # (workload, rng) -> {param name: array} (random, never zeros)
    fallback: Callable  # (workload, DeviceInfo) -> config
    space_vars: Callable  # (workload) -> {name: value} the search space's constraints may use
    variables: dict  # name -> meaning, of what space_vars returns (documents the constraints' vocabulary)
    output: str = "Y"
    space_file: str | None = None  # search-space name or path when not the template's own name

    def space(self, workload=None, device=None, **fixed):
        """The declarative search space (``search_space/<name>.toml``); given a workload and a device
        (DeviceInfo), the bound space of its valid configs, with the storage dtype fixed to the workload's
        and any other knobs given in ``fixed`` (e.g. ``input_scope="texture"``)."""
        from tuner.search_space import load_space
        space = load_space(self.space_file or self.name, {f.name for f in dataclasses.fields(self.config)}, set(self.variables))
        if workload is None:
            return space
        info = getattr(device, "info", device)
        return space.bind(self.space_vars(workload), info, {"dtype": workload.dtype, **fixed})

    def fallback_with(self, workload, device, **fixed):
        """The fallback config for ``device`` with ``fixed`` knobs applied (scopes, a model's pinned layout);
        if that breaks a constraint of the space, a valid config drawn with seed 0 instead."""
        cfg = dataclasses.replace(self.fallback(workload, getattr(device, "info", device)), **fixed)
        space = self.space(workload, device, **fixed)
        if not space.violations(self.config_values(workload, cfg)):
            return cfg
        return self.make_config(space.sample(np.random.default_rng(0)))

    def make_config(self, values: dict):
        """A config from a search-space assignment (the task knob ``dtype`` belongs to the workload)."""
        return self.config(**{k: v for k, v in values.items() if k != "dtype"})

    def config_values(self, workload, config) -> dict:
        return {"dtype": workload.dtype, **dataclasses.asdict(config)}

    def tolerance(self, workload) -> float:
        """Max relative error accepted against the reference: float32 1e-4, float16 storage 1e-2."""
        return 1e-2 if workload.dtype == "float16" else 1e-4

    def check(self, workload, outputs: dict, inputs: dict) -> float:
        """Max error relative to the reference's largest magnitude."""
        ref = self.reference(workload, inputs)
        got = np.asarray(outputs[self.output], dtype=np.float64)
        if got.shape != ref.shape:
            raise TunerError(f"{self.name}: output shape {got.shape}, reference {ref.shape}")
        return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def _registry() -> dict:
    from . import conv2d_nchw4c, dense, depthwise_conv2d_nchw4c
    return {t.name: t for t in (conv2d_nchw4c.TEMPLATE, depthwise_conv2d_nchw4c.TEMPLATE, dense.TEMPLATE)}


TEMPLATES: dict = {}


def get_template(name: str) -> Template:
    """A registered template by name, or ``"package.module:ATTRIBUTE"`` for one defined elsewhere (worker
    processes find user templates this way)."""
    if ":" in name:
        import importlib
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise TunerError(f"cannot load template {name!r}: {e}") from None
    if not TEMPLATES:
        TEMPLATES.update(_registry())
    if name not in TEMPLATES:
        raise TunerError(f"unknown template {name!r}; templates: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]
