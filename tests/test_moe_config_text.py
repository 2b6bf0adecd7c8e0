"""The moe backend's configuration text (moe_describe) names every MoeConfig field. A held graph is found again only
where the text at capture equals the text now, so a knob missing from it lets one configuration's graph serve
another's call (the thirty-fifth session's first late-output run did exactly that), and KBENCH_PRINT_CONFIG hides it."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _config_fields() -> list[str]:
    api = (ROOT / "kernels/moe/cuda/moe_api.h").read_text()
    body = api[api.index("struct MoeConfig {"):]
    body = body[:body.index("};")]
    return re.findall(r"^\s*(?:bool|int)\s+(\w+);", body, flags=re.M)


def _describe() -> tuple[str, str]:
    src = (ROOT / "kernels/moe/cuda/moe.cu").read_text()
    body = src[src.index("void moe_describe("):]
    body = body[:body.index("\n}\n")]
    fmt = "".join(re.findall(r'"([^"]*)"', body))
    args = body[body.rindex('",') + 2:]
    return fmt, args


def test_every_config_field_is_in_the_describe_text_in_order():
    fields = _config_fields()
    assert len(fields) >= 13, fields
    fmt, args = _describe()
    assert re.findall(r"(\w+)=%d", fmt) == fields, "moe_describe's format names each MoeConfig field, in order"
    assert re.findall(r"c\.(\w+)", args) == fields, "and passes each field, in order"
