"""Policies validated against the generated schema: the mistakes the issue names are errors told by ``@id``."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from bastion import Service
from bastion.policy._engine import PolicyValidationError, parse_policies
from bastion.policy._schema import PolicySchema
from bastion.policy._validation import check_policies, validate
from tests.bastion.policy.test_schema import page, schema_of, shop_service


@pytest.fixture(scope="module")
def schema() -> PolicySchema:
    return schema_of(shop_service())


def problems(schema: PolicySchema, text: str) -> tuple[list[str], list[str]]:
    return validate(schema, parse_policies(text, origin="p.cedar"))


class TestValid:
    def test_roles_method_and_version_without_listing_routes(self, schema: PolicySchema) -> None:
        text = (
            '@id("readers")\npermit(principal, action, resource) when { principal.roles.contains("reader") && '
            'context.method == "GET" && context.version == 2 };'
        )
        assert problems(schema, text) == ([], [])

    def test_owner_comparison_guarded_by_has(self, schema: PolicySchema) -> None:
        """``resource.owner_id`` needs no guard where every resource in scope has it; ``principal.sub`` does."""
        text = (
            'permit(principal, action == Action::"GET /api/v2/orders/{order_id}", resource)\n'
            "when { principal has sub && principal.sub == resource.owner_id && !resource.archived };\n"
            "permit(principal, action, resource) when { resource has owner_id && principal has sub && "
            "principal.sub == resource.owner_id };"
        )
        assert problems(schema, text) == ([], [])

    def test_an_undeclared_extractor_lets_its_routes_read_any_attribute(self, schema: PolicySchema) -> None:
        text = (
            'permit(principal, action == Action::"PUT /api/v2/notes/{note_id}", resource) when { resource.tier > 2 };'
        )
        assert problems(schema, text) == ([], [])


class TestErrors:
    def test_misspelled_principal_attribute(self, schema: PolicySchema) -> None:
        text = '// readers\n@id("readers")\npermit(principal, action, resource) when { principal.role.contains("r") };'
        assert problems(schema, text) == (
            [
                'statement 1 (line 2), @id("readers"): attribute `role` on entity type `User` not found; did you '
                "mean `roles`?"
            ],
            [],
        )

    def test_action_no_route_makes(self, schema: PolicySchema) -> None:
        text = (
            'permit(principal, action, resource);\n@id("nope")\n'
            'permit(principal, action == Action::"GET /api/v2/nope", resource);'
        )
        assert problems(schema, text) == (
            ['statement 2 (line 2), @id("nope"): unrecognized action `Action::"GET /api/v2/nope"`'],
            [],
        )

    def test_attribute_only_some_resources_in_scope_have(self, schema: PolicySchema) -> None:
        text = (
            '@id("owner")\n'
            "permit(principal, action, resource) when { principal has sub && principal.sub == resource.owner_id };"
        )
        assert problems(schema, text) == (
            ['statement 1 (line 1), @id("owner"): attribute `owner_id` on entity type `Resource` not found'],
            [],
        )

    def test_an_unguarded_claim_is_a_warning_as_the_spec_writes_it(self, schema: PolicySchema) -> None:
        """The spec's ownership pattern reads ``principal.sub`` without ``has``: it must still start (a caller
        without the claim fails the evaluation, and a failure denies), with a warning that says so."""
        text = 'permit(principal, action, resource) when { principal.sub == "alice" };'
        assert problems(schema, text) == (
            [],
            [
                "statement 1 (line 1): unable to guarantee safety of access to optional attribute `sub` on entity "
                "type `User`",
                "statement 1 (line 1): attribute `sub` on entity type `Anonymous` not found (a caller without a "
                "token has no sub: test `principal has sub` first)",
            ],
        )

    def test_misspelled_context_attribute(self, schema: PolicySchema) -> None:
        text = "permit(principal, action, resource) when { context.verison == 2 };"
        assert problems(schema, text) == (
            ["statement 1 (line 1): attribute `verison` in context not found; did you mean `version`?"],
            [],
        )

    def test_type_error(self, schema: PolicySchema) -> None:
        text = 'permit(principal, action, resource) when { context.version > "2" };'
        assert problems(schema, text) == (["statement 1 (line 1): unexpected type: expected Long but saw String"], [])

    def test_check_raises_one_line_naming_the_file(self, schema: PolicySchema) -> None:
        text = (
            '@id("a")\npermit(principal, action, resource) when { principal.role.contains("r") };\n'
            '@id("b")\npermit(principal, action, resource) when { context.verison == 2 };'
        )
        with pytest.raises(PolicyValidationError) as info:
            check_policies(schema, parse_policies(text, origin="policy file 'p.cedar'"))
        assert str(info.value) == (
            "policy file 'p.cedar' does not validate against the service's schema: statement 1 (line 1), "
            '@id("a"): attribute `role` on entity type `User` not found; did you mean `roles`? (and 1 more)'
        )
        assert info.value.lines[1] == (
            "policy file 'p.cedar' does not validate against the service's schema: statement 2 (line 3), "
            '@id("b"): attribute `verison` in context not found; did you mean `version`?'
        )


class TestOpenActions:
    def test_with_a_fallback_an_unknown_action_is_a_warning(self) -> None:
        service = shop_service()
        service.set_fallback(page)
        schema = schema_of(service)
        text = 'permit(principal, action == Action::"GET /legacy/report", resource);'
        assert problems(schema, text) == (
            [],
            ['Action::"GET /legacy/report" names no route: only the fallback or a frontend route can serve it'],
        )
        with capture_logs() as logs:
            check_policies(schema, parse_policies(text, origin="p.cedar"))
        assert [(entry["event"], entry["log_level"]) for entry in logs] == [("policy_validation_warnings", "warning")]

    def test_an_extractor_for_an_action_declares_it(self) -> None:
        service = Service("gateway")
        service.version(1)
        service.set_fallback(page)
        service.resource_extractor("GET /legacy/report", attributes={"owner_id": str})(lambda scope, params: {})
        text = (
            'permit(principal, action == Action::"GET /legacy/report", resource) when { principal has sub && '
            "principal.sub == resource.owner_id };"
        )
        assert problems(schema_of(service), text) == ([], [])


def test_the_specs_policy_shapes_start_as_a_user_copies_them() -> None:
    """service-framework.md, Authorization 3-4, written against the example's routes: no error (the unguarded
    ``principal.sub`` of the ownership permit is a warning)."""
    from examples.documents_api import service

    text = """
permit(principal, action, resource) when { principal.roles.contains("admin") };
permit(principal, action in [Action::"GET /api/v1/documents", Action::"GET /api/v2/documents"], resource);
permit(principal, action == Action::"GET /api/v2/documents/{user_id}/{doc_id}", resource)
when { principal.sub == resource.owner_id };
forbid(principal, action == Action::"GET /api/v2/admin/users", resource)
unless { principal.roles.contains("admin") };
"""
    errors, warnings = problems(schema_of(service), text)
    assert errors == []
    assert [line.split(":", 1)[0] for line in warnings] == ["statement 3 (line 4)", "statement 3 (line 4)"]
