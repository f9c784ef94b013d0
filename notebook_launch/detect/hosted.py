"""Which hosted notebook service we run on: the one rule, used by every detector."""
from __future__ import annotations

from typing import Collection, Mapping

COLAB_VARIABLES = ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_BACKEND_VERSION")
KAGGLE_VARIABLES = ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE", "KAGGLE_DATA_PROXY_URL")


def hosted_service(environ: Mapping[str, str], modules: Collection[str] = (),
                   shell_class: str | None = None) -> tuple[str | None, str]:
    """("colab" | "kaggle" | None, why). A variable counts when it is set at all
    (Colab sets COLAB_GPU to "" on CPU runtimes)."""
    colab = [k for k in COLAB_VARIABLES if k in environ]
    if colab or "google.colab" in modules or "google.colab" in (shell_class or ""):
        return "colab", "Colab: " + (", ".join(f"${k}" for k in colab) or "google.colab")
    kaggle = [k for k in KAGGLE_VARIABLES if k in environ]
    if kaggle:
        return "kaggle", "Kaggle: " + ", ".join(f"${k}" for k in kaggle)
    return None, ""
