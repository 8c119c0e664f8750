"""The Cedar engine: parse once, locate errors, Cedar's decision rules, errors never allow."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.policy._engine import Decision, PolicyEngine, PolicyLoadError, evaluate, parse_policies, split_statements

PRINCIPAL = ("User", "alice", {"sub": "alice", "roles": ["user"], "perms": []})


def decide(text: str, action: str = "GET /x", resource: dict[str, object] | None = None, **context: object) -> Decision:
    return evaluate(
        parse_policies(text),
        principal=PRINCIPAL,
        action=action,
        resource=("Resource", "/x", resource or {}),
        context=context,
    )


class TestDecisions:
    def test_default_is_deny(self) -> None:
        decision = decide('permit(principal, action == Action::"GET /other", resource);')
        assert not decision.allowed and not decision.failed and decision.reasons == ()

    def test_permit(self) -> None:
        assert decide("permit(principal, action, resource);").allowed

    def test_forbid_wins_over_permit(self) -> None:
        text = (
            '@id("deny-x")\nforbid(principal, action == Action::"GET /x", resource);\n'
            + "permit(principal, action, resource);"
        )
        decision = decide(text)
        assert not decision.allowed
        assert decision.reasons == ("deny-x",)

    def test_reasons_are_id_annotations_or_policy_ids(self) -> None:
        assert decide('@id("all")\npermit(principal, action, resource);').reasons == ("all",)
        assert decide("permit(principal, action, resource);").reasons == ("policy0",)

    def test_erroring_forbid_is_a_failure_not_an_allow(self) -> None:
        """cedarpy skips a forbid whose condition errors and would answer Allow: we must not."""
        text = (
            "permit(principal, action, resource);\n"
            'forbid(principal, action, resource) when { resource.classification == "secret" };'
        )
        decision = decide(text)
        assert decision.failed
        assert not decision.allowed
        assert "classification" in decision.errors[0]

    def test_missing_principal_attribute_is_a_failure(self) -> None:
        decision = decide('permit(principal, action, resource) when { principal.email like "*@corp" };')
        assert decision.failed and not decision.allowed

    def test_roles_contains_and_owner_shapes(self) -> None:
        text = (
            'permit(principal, action, resource) when { principal.roles.contains("user") && '
            "principal.sub == resource.owner_id };"
        )
        assert decide(text, resource={"owner_id": "alice"}).allowed
        assert not decide(text, resource={"owner_id": "bob"}).allowed

    def test_action_sets(self) -> None:
        text = 'permit(principal, action in [Action::"GET /a", Action::"GET /x"], resource);'
        assert decide(text).allowed
        assert not decide(text, action="POST /x").allowed

    def test_context_attributes(self) -> None:
        text = 'permit(principal, action, resource) when { context.ip_address == "10.0.0.1" };'
        assert decide(text, ip_address="10.0.0.1").allowed
        assert not decide(text, ip_address="10.0.0.2").allowed


class TestParsing:
    def test_statements_split_outside_strings_and_comments(self) -> None:
        text = (
            '// a; comment\n@id("x;y")\npermit(principal, action, resource) when { context.s == ";" };\n'
            "\nforbid(principal, action, resource);\n"
        )
        statements = list(split_statements(text))
        assert [(number, line) for number, line, _ in statements] == [(1, 2), (2, 5)]

    def test_error_names_statement_and_line(self) -> None:
        text = "permit(principal, action, resource);\n\n// next\nforbid(principal, actoin, resource);\n"
        with pytest.raises(PolicyLoadError, match=r"^p\.cedar does not parse: statement 2 \(line 4\): .*actoin"):
            parse_policies(text, origin="p.cedar")

    def test_unterminated_last_statement(self) -> None:
        with pytest.raises(PolicyLoadError, match=r"statement 2 \(line 2\)"):
            parse_policies("permit(principal, action, resource);\npermit(principal, action, resource)", origin="p")

    @pytest.mark.parametrize("text", ["", "// only a comment\n", "   \n"])
    def test_empty_policy_file_is_refused(self, text: str) -> None:
        with pytest.raises(PolicyLoadError, match="has no policies"):
            parse_policies(text, origin="p")

    def test_missing_file(self, tmp_path: Path) -> None:
        absent = tmp_path / "absent.cedar"
        with pytest.raises(PolicyLoadError) as info:
            PolicyEngine(absent)
        assert str(info.value) == f"policy file {str(absent)!r}: cannot read the file (no such file)"

    def test_missing_file_names_the_config_key(self, tmp_path: Path) -> None:
        absent = tmp_path / "absent.cedar"
        with pytest.raises(PolicyLoadError) as info:
            PolicyEngine(absent, key="policy.policy_path")
        assert str(info.value) == f"policy.policy_path = {str(absent)!r}: cannot read the file (no such file)"

    def test_binary_garbage(self, tmp_path: Path) -> None:
        path = tmp_path / "p.cedar"
        path.write_bytes(b"\xff\xfe\x00garbage")
        with pytest.raises(PolicyLoadError):
            PolicyEngine(path)

    def test_context_attributes_read_by_the_policies(self) -> None:
        text = (
            'permit(principal, action, resource) when { context.ip_address == "1" };\n'
            "permit(principal, action, resource) when { context has user_agent };\n"
            'permit(principal, action, resource) when { principal.roles.contains("a") };'
        )
        assert parse_policies(text).context_attributes == {"ip_address", "user_agent"}

    def test_context_used_whole_means_every_attribute(self) -> None:
        text = 'permit(principal, action, resource) when { context == {"a": 1} };'
        assert parse_policies(text).context_attributes is None


class TestReload:
    def test_reload_swaps_and_bad_file_keeps_the_old_set(self, tmp_path: Path) -> None:
        path = tmp_path / "p.cedar"
        path.write_text("permit(principal, action, resource);")
        engine = PolicyEngine(path)
        first = engine.current
        path.write_text("forbid(principal, action, resource);\npermit(principal, action, resource);")
        second = engine.reload()
        assert engine.current is second and second.digest != first.digest
        path.write_text("permit(principal, action, resource")
        with pytest.raises(PolicyLoadError):
            engine.reload()
        assert engine.current is second


class TestErrorsNameTheStatement:
    def test_sources_map_cedar_ids_to_statements(self) -> None:
        text = '// one\n@id("first")\npermit(principal, action, resource);\n\nforbid(principal, action, resource);'
        sources = parse_policies(text).sources
        assert {policy_id: source.describe() for policy_id, source in sources.items()} == {
            "policy0": 'statement 1 (line 2), @id("first")',
            "policy1": "statement 2 (line 5)",
        }

    def test_evaluation_error_names_the_id_not_policy0(self) -> None:
        decision = decide(
            'permit(principal, action, resource);\n@id("readers")\n'
            'forbid(principal, action, resource) when { principal.role.contains("r") };'
        )
        assert decision.errors == (
            'error while evaluating statement 2 (line 2), @id("readers"): `User::"alice"` does not have the '
            "attribute `role`",
        )
