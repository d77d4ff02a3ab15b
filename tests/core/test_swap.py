"""One helper swaps model classes: a mixin in front of a module's own class, state beside it, and back."""

from __future__ import annotations

import mlx.nn as nn

from specbench.core.swap import mixed_class, own_class, restore_class, swap_class


class _Doubling:
    def __call__(self, x):
        return 2 * super().__call__(x) + self._specbench_offset


class Identity(nn.Module):
    def __call__(self, x):
        return x


def test_swapped_twice_the_module_keeps_its_own_class_underneath_and_gets_it_back():
    module = Identity()
    swap_class(module, _Doubling, _specbench_offset=1)
    assert module(3) == 7 and type(module) is mixed_class(_Doubling, Identity) and own_class(module) is Identity
    swap_class(module, _Doubling, _specbench_offset=2)  # re-armed without a restore in between
    assert module(3) == 8 and type(module).__mro__[1:3] == (_Doubling, Identity)
    restore_class(module, "_specbench_offset")
    assert type(module) is Identity and module(3) == 3 and "_specbench_offset" not in module.__dict__
    assert mixed_class(_Doubling, Identity) is mixed_class(_Doubling, Identity)  # made once
