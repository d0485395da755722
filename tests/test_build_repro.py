"""The same warm-start config builds the same models: two builds of a tiny config (the extractor in its own process
beside the policy, one thread each, as on any two-core machine) give byte-identical weights. Demonstrations, the
tokenizer, the SFT batches, the DAgger rollouts' sampling (derive_seed per chunk and turn) and model init are all
seeded from WarmStartConfig.seed; a different seed gives different models."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from test_warmstart import tiny  # pytest puts tests/ on the path (rootdir import mode "prepend")

from trainers import warmstart as W


def _weights(root: Path) -> dict[str, str]:
    return {r: hashlib.sha256((root / "models" / r / "model.safetensors").read_bytes()).hexdigest()
            for r in ("policy", "extractor")}


@pytest.mark.slow
def test_two_builds_of_one_config_give_the_same_weights(tmp_path):
    cfg = tiny(threads=2, demo_episodes=12, dagger_episodes=4, policy_steps=6, extractor_steps=4)
    builds = []
    for name in ("a", "b"):
        W.ensure_models(tmp_path / name, cfg, progress=False)
        builds.append(_weights(tmp_path / name))
    assert builds[0] == builds[1]
    W.ensure_models(tmp_path / "c", tiny(threads=2, demo_episodes=12, dagger_episodes=4, policy_steps=6, extractor_steps=4,
                                         seed=1), progress=False)
    other = _weights(tmp_path / "c")
    assert other["policy"] != builds[0]["policy"] and other["extractor"] != builds[0]["extractor"]
