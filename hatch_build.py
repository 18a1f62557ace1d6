"""Build hook: the sdist ships exactly the files pyproject.toml lists.

hatchling force-includes the VCS ignore file it read (``.gitignore``) in every sdist, past
any ``exclude``; the sdist's file list is explicit here, so that file has nothing to say and
is taken back out.
"""

from __future__ import annotations

import os
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

VCS_IGNORE_FILES = frozenset({".gitignore", ".hgignore"})


class SdistFilesAsListed(BuildHookInterface[Any]):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "sdist":
            return
        force_include = build_data["force_include"]
        for source in [p for p in force_include if os.path.basename(p) in VCS_IGNORE_FILES]:
            del force_include[source]
