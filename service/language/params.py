"""Job params checked against a profile's declaration, with defaults filled in."""

import copy
from collections.abc import Mapping
from typing import Any

from service.language.profiles import Profile
from service.language.specs import ErrorEntry, json_type_ok
from service.platform.errors import (
    ParamsInvalid,
)


def resolve_params(profile: Profile, given: Mapping[str, Any]) -> dict[str, Any]:
    """Check job params against the declaration and fill defaults. ``None`` counts as absent,
    as JSON clients often send null for "not set"."""
    errors: list[ErrorEntry] = [
        {"param": name, "code": "unknown_param", "message": f"unknown param {name!r}"}
        for name in given
        if name not in profile.params
    ]
    resolved: dict[str, Any] = {}
    for name, spec in profile.params.items():
        value = given.get(name)
        if value is None:
            if spec.required:
                errors.append(
                    {
                        "param": name,
                        "code": "missing_param",
                        "message": f"param {name!r} is required",
                    }
                )
            resolved[name] = copy.deepcopy(spec.default)
        elif json_type_ok(spec.type, value):
            resolved[name] = value
        else:
            errors.append(
                {
                    "param": name,
                    "code": "wrong_type",
                    "message": f"param {name!r} must be of type {spec.type}",
                }
            )
    if errors:
        raise ParamsInvalid(f"invalid params: {errors[0]['message']}", {"errors": errors})
    return resolved
