"""Why a test is skipped where an optional piece is missing: one wording, with what to install."""

TORCH_MISSING = ("PyTorch is not installed: it is the optional extra [torch] (pip install torch==2.13.0 "
                 "--index-url https://download.pytorch.org/whl/cpu, then pip install -e '.[torch]')")
