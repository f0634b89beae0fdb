"""Print the pins of the oldest job (`make test-oldest`): `NAME==FLOOR` for each library mmpos plugs into.

The floors are the `>=` bounds that pyproject.toml declares in its extras (timm, clip, graph, hf), so raising one there moves the oldest job with it.
Exits with status 1 when a library has no floor or two different ones.
"""

import re
import sys
from pathlib import Path

LIBRARIES = ("transformers", "timm", "open_clip_torch", "torch-geometric")


def main() -> int:
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    pins = []
    for name in LIBRARIES:
        floors = set(re.findall(rf'"{re.escape(name)}>=([^,;"\s]+)', text))
        if len(floors) != 1:
            print(
                f"oldest_pins.py: pyproject.toml must declare one floor for {name}, found {sorted(floors)}",
                file=sys.stderr,
            )
            return 1
        pins.append(f"{name}=={floors.pop()}")
    print(" ".join(pins))
    return 0


if __name__ == "__main__":
    sys.exit(main())
