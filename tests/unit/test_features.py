"""Each model's features (conformance/matrix/features.py) against the module itself, and ci's
coverage contract over them (conformance/matrix/contract.py): met by ci's cells, reported
where not."""

from __future__ import annotations

import json

import torch
from torch import nn

from conformance.matrix.axes import pairwise_values
from conformance.matrix.contract import SPECIAL_INITS, contracted, family, items_of, unmet_contract
from conformance.matrix.features import FEATURES, features
from conformance.matrix.profiles import cells
from conformance.reports.summary import _unmet_contract
from fixtures.models import MODELS, fixture_for

PIN_UNSUPPORTED = dict.fromkeys(("legacy_jit_fsdp", "nvfuser"), "")


def _built(model: str, tie: str, spec: str | None = None) -> nn.Module:
    torch.manual_seed(0)
    return fixture_for(model, spec).build(tie == "tied")


def test_each_feature_is_what_the_module_shows() -> None:
    for name, fixture in MODELS.items():
        for tie in fixture.ties:
            module = _built(name, tie)
            found = features(name, tie, 2)
            assert found <= set(FEATURES)
            named = list(module.named_parameters(remove_duplicate=False))
            assert ("tie" in found) == (len({id(p) for _, p in named}) < len(named)), name
            assert ("frozen" in found) == any(not p.requires_grad for _, p in named), name
            assert ("ragged" in found) == any(p.shape[0] % 2 for _, p in named), name
            assert ("dropout" in found) == any(isinstance(m, nn.Dropout) for m in module.modules()), name
            assert ("litgpt" in found) == name.startswith("litgpt"), name
            assert ("root_owned" in found) == any("." not in k for k in module.state_dict()), name
            # only BatchNorm's running statistics move in a training forward, only root_owned's
            # projection is drawn at random; a rotary cache (litgpt's) is no persistent buffer
            norms = [m for m in module.modules() if isinstance(m, nn.BatchNorm1d)]
            assert ("trained_buffer" in found) == bool(norms), name
            assert ("random_buffer" in found) == hasattr(module, "projection"), name
            assert ("persistent_buffer" in found) == bool(set(module.state_dict()) - {n for n, _ in named}), name


def test_a_running_statistic_moves_and_a_random_buffer_differs_between_seeds() -> None:
    # what the derivation reads, shown on root_owned itself
    first, second = _built("root_owned", "untied"), _built("root_owned", "untied")
    torch.manual_seed(1)
    other = fixture_for("root_owned").build(False)
    assert torch.equal(first.projection, second.projection) and not torch.equal(first.projection, other.projection)
    before = first.norm.running_mean.clone()
    first.train()(fixture_for("root_owned").make_input(torch.Generator().manual_seed(0), torch.float32))
    assert not torch.equal(first.norm.running_mean, before)


def test_a_generated_models_features_come_from_its_spec_the_same_way() -> None:
    spec = json.dumps({"widths": [4, 4, 4, 3], "bias": [True, False, True], "ties": [[0, 1]]})
    assert features("generated", "tied", 2, spec) == {"tie", "ragged"}  # 3 rows: 2 does not divide them
    even = json.dumps({"widths": [4, 4], "bias": [False], "ties": []})
    assert features("generated", "untied", 2, even) == frozenset()
    assert features("generated", "untied", 3, even) == {"ragged"}


def test_the_contract_names_only_what_an_allowed_cell_can_meet() -> None:
    wanted = contracted(pairwise_values("ci", 2, PIN_UNSUPPORTED))
    triples = {dict(i)["feature"] for i in wanted if len(i) == 3}
    assert triples == set(FEATURES)
    # the dropout model trains only: its dropout meets no other scenario
    dropout = [dict(i) for i in wanted if dict(i)["feature"] == "dropout"]
    assert dropout and all(i.get("scenario", "train") == "train" for i in dropout)
    # an init meets a feature only where it treats it specially
    for item in wanted:
        if len(item) == 2:
            assert dict(item)["feature"] in SPECIAL_INITS


def test_ci_meets_the_contract_and_a_missing_triple_is_named_with_the_profile_that_meets_it() -> None:
    ci = [c for c in cells("ci", 2, PIN_UNSUPPORTED) if c.composition not in PIN_UNSUPPORTED]
    assert unmet_contract(ci, 2, PIN_UNSUPPORTED, nightly=None) == []
    # the check itself: without ci's FSDP resume cells of a model whose training moves a buffer
    # (the pairwise array alone had none), that triple is reported, and where nightly has it
    fsdp_resume_trained = {("feature", "trained_buffer"), ("family", "fsdp"), ("scenario", "resume")}
    without = [c for c in ci if not fsdp_resume_trained <= set().union(*items_of(c.__dict__))]
    unmet = unmet_contract(without, 2, PIN_UNSUPPORTED, nightly=None)
    assert {"feature": "trained_buffer", "family": "fsdp", "scenario": "resume"} in unmet
    lines = _unmet_contract([{"feature": "tie", "family": "ddp", "scenario": "reshape", "covered_by": "nightly"}])
    assert "- feature=tie × family=ddp × scenario=reshape (nightly covers it)" in lines
    assert _unmet_contract([])[0].startswith("Every contracted")


def test_nightly_meets_the_contract_too() -> None:
    # its strength-3 array meets (model, composition, scenario) for FSDP; DDP's pairwise
    # array happens to meet DDP's triples (docs/matrix.md#the-coverage-contract)
    nightly = [c for c in cells("nightly", 2, PIN_UNSUPPORTED) if c.composition not in PIN_UNSUPPORTED]
    assert unmet_contract(nightly, 2, PIN_UNSUPPORTED, profile="nightly", nightly=None) == []
    # so a triple a ci run leaves unmet is named as nightly's
    ci = [c for c in cells("ci", 2, PIN_UNSUPPORTED) if c.composition not in PIN_UNSUPPORTED]
    frozen_ddp_accumulate = [
        c
        for c in ci
        if c.scenario == "accumulate"
        and family(c.composition) == "ddp"
        and "frozen" in features(c.model, c.tie, c.world_size, c.spec)
    ]
    assert frozen_ddp_accumulate  # lora's, or root_owned's frozen gain
    without = [c for c in ci if c not in frozen_ddp_accumulate]
    unmet = unmet_contract(without, 2, PIN_UNSUPPORTED, nightly=nightly)
    assert {"feature": "frozen", "family": "ddp", "scenario": "accumulate", "covered_by": "nightly"} in unmet
