"""``use_rope(..., encoder_options=...)``: arguments of the installed scheme's rotary encoder that the model does not
give (GRAPE's ``log_freq_scale``), on a tiny random Qwen2-VL; recorded in the config and restored from it."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from _tiny_hf import QWEN2_VISION, TEXT
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

from mmpos import Coords, create
from mmpos.integrations.hf_rope import CONFIG_KEY, apply_config_rope, use_rope

pytestmark = pytest.mark.hf  # run on the oldest and the newest supported transformers
TOKENS = {"image_token_id": 120, "video_token_id": 121, "vision_start_token_id": 122, "vision_end_token_id": 123}


def _qwen2_vl():
    text = dict(TEXT, rope_theta=10000.0, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    return Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=QWEN2_VISION, **TOKENS))


def _rotary(model):
    return model.model.language_model.rotary_emb


@pytest.mark.parametrize("scheme", ["grape", "grape-i"])
def test_encoder_options_reach_the_encoder_and_the_config(scheme):
    torch.manual_seed(0)
    model = _qwen2_vl().eval()
    use_rope(model, scheme, encoder_options={"log_freq_scale": 2.0})
    section = {"mrope_section": [2, 3, 3]} if scheme == "grape" else {}  # grape: the model's own sections
    want = create(scheme, head_dim=16, theta=10000.0, log_freq_scale=2.0, **section)
    assert torch.equal(_rotary(model).encoder.weight, want.weight)
    assert not torch.equal(want.weight, create(scheme, head_dim=16, theta=10000.0, **section).weight)
    assert getattr(model.config, CONFIG_KEY) == {"scheme": scheme, "encoder_options": {"log_freq_scale": 2.0}}
    pos = Coords(torch.randint(0, 50, (1, 7, 3)).float(), ("t", "h", "w"))
    use_rope(model, "own")
    setattr(model.config, CONFIG_KEY, {"scheme": scheme, "encoder_options": {"log_freq_scale": 2.0}})
    apply_config_rope(model)  # what from_pretrained does with a saved config
    torch.testing.assert_close(_rotary(model).encoder.angles(pos), want.angles(pos), rtol=0, atol=0)


def test_encoder_options_errors():
    model = _qwen2_vl().eval()
    with pytest.raises(TypeError, match="encoder_options must be a mapping"):
        use_rope(model, "grape", encoder_options=[("log_freq_scale", 2.0)])
    with pytest.raises(ValueError, match=r"encoder_options must not set \['theta'\]"):
        use_rope(model, "grape", encoder_options={"theta": 1e6})
    with pytest.raises(ValueError, match="takes no argument 'log_freq_scal'"):
        use_rope(model, "grape", encoder_options={"log_freq_scal": 2.0})
    with pytest.raises(ValueError, match="log_freq_scale must be a finite number > 0"):
        use_rope(model, "grape-i", encoder_options={"log_freq_scale": 0.0})
