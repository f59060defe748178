"""Shared building blocks of the typed Task/TaskShard models.

Contract: every model field carries a description (the CRD generator copies it into the openAPIV3Schema and a
unit test fails when one is missing); field names are Python snake_case with Kubernetes camelCase aliases;
unknown fields are rejected. CEL rules for the CRD sit next to the field or model they check, written with
:func:`cel`, so the models are the one source of truth for both Python validation and the CRD schema.

The Task's processor, source, sink and storage are defined once, in ``spark_runtime.config`` (fields, limits,
defaults, validators); their Task models subclass those together with :class:`K8sModel` and add descriptions and
CEL rules with :func:`k8s_schema`.
"""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from spark_runtime import config

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "DNS_SUBDOMAIN_PATTERN",
    "QUANTITY_PATTERN",
    "FreeFormObject",
    "K8sModel",
    "Quantity",
    "cel",
    "k8s_schema",
    "validations",
]

API_GROUP = "taskshard.io"
API_VERSION = "v1alpha1"

DNS_SUBDOMAIN_PATTERN = config.DNS_SUBDOMAIN_PATTERN
"""An RFC 1123 subdomain: the name of most Kubernetes objects (at most 253 characters)."""

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)"
    r"|(\.[0-9]+))))?$"
)
"""Kubernetes' resource.Quantity syntax (as controller-gen emits it)."""


def cel(
    rule: str,
    message: str,
    *,
    field_path: str | None = None,
    reason: str | None = None,
    message_expression: str | None = None,
) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry. ``message`` names the field and says what is valid.

    ``field_path`` is relative to the object the rule sits on (e.g. ``.split.at``); ``reason`` is one of
    ``FieldValueInvalid`` (default), ``FieldValueRequired``, ``FieldValueForbidden``, ``FieldValueDuplicate``.
    ``message_expression`` is a CEL string expression (same variables as ``rule``) for a message that names the
    offending values; the apiserver shows it instead of ``message``, which stays as the fallback should the
    expression fail.
    """
    entry = {"rule": rule, "message": message}
    if message_expression:
        entry["messageExpression"] = message_expression
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules (for ``Field(...)`` or a model's ``model_config``)."""
    return {"x-kubernetes-validations": list(rules)}


def k8s_schema(
    *rules: dict[str, str], field_rules: dict[str, list[dict[str, str]]] | None = None, **descriptions: str
) -> ConfigDict:
    """``model_config`` of a Task model built on a runtime model of ``spark_runtime.config``: the CRD additions.

    ``rules`` are the model's CEL rules (as :func:`validations`), ``field_rules`` those of single fields (a map a
    rule iterates carries its rule itself, next to its bounds); ``descriptions`` maps the Python names of
    inherited fields to their descriptions. Both go into the JSON schema only (hence the CRD); the fields
    themselves (types, limits, defaults, validators) stay exactly the runtime's. A name that is not a field of the
    model fails the schema generation (KeyError), and a field left without a description fails the CRD test.
    """

    def extra(schema: dict[str, Any], model: type[BaseModel]) -> None:
        properties = schema.get("properties", {})
        for name, text in descriptions.items():
            properties[model.model_fields[name].alias or name]["description"] = text
        for name, field_cel in (field_rules or {}).items():
            properties[model.model_fields[name].alias or name].update(validations(*field_cel))
        if rules:
            schema.update(validations(*rules))

    return ConfigDict(json_schema_extra=extra)


Quantity = Annotated[
    int | Annotated[str, Field(pattern=QUANTITY_PATTERN)],
    WithJsonSchema(
        {
            "description": "A resource quantity: an integer or a string such as 500m or 2Gi.",
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes resource quantity: an integer (``1``) or a string (``"500m"``, ``"2Gi"``)."""

FreeFormObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""An arbitrary JSON object, kept as is by the apiserver (no pruning)."""


class K8sModel(BaseModel):
    """Base of every spec/status model: camelCase aliases, unknown fields forbidden, frozen values.

    ``to_k8s()`` gives the JSON-ready dict the apiserver stores (aliases, ``None`` fields dropped);
    ``from_k8s()`` parses one back. ``Model.from_k8s(m.to_k8s()) == m`` for every valid model.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=False,
    )

    def to_k8s(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @classmethod
    def from_k8s(cls, data: dict[str, Any]) -> Self:
        return cls.model_validate(data)
