"""OR-Tools' CP-SAT module, imported without pandas.

`ortools.sat.python.cp_model` imports pandas at module level only to name `pd.Index` and `pd.Series`
in the signatures of its `*_series` helpers, which paraplan never calls; pandas costs ~0.15 s of CPU at
every command's start. When pandas is not already loaded, the import runs against a stand-in module that
defines those two names (as classes nothing is an instance of) and removes it again afterwards, so a later
`import pandas` loads the real library. Should a future OR-Tools need more of pandas at import, the
stand-in is dropped and CP-SAT is imported the ordinary way.
"""

from __future__ import annotations

import sys
import types


def _import_without_pandas() -> types.ModuleType:
    from importlib import import_module

    name = "ortools.sat.python.cp_model"
    if name in sys.modules or "pandas" in sys.modules:
        return import_module(name)
    stand_in = types.ModuleType("pandas")
    stand_in.__doc__ = "Stand-in: the names cp_model's signatures use, nothing else."
    stand_in.Index = type("Index", (), {})
    stand_in.Series = type("Series", (), {})
    sys.modules["pandas"] = stand_in
    try:
        return import_module(name)
    except Exception:
        sys.modules.pop(name, None)
        sys.modules.pop("pandas", None)
        return import_module(name)
    finally:
        if sys.modules.get("pandas") is stand_in:
            del sys.modules["pandas"]


cp_model = _import_without_pandas()

__all__ = ["cp_model"]
