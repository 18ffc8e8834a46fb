import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # oracle.py
# JAX would otherwise reserve most of the GPU's memory at its first use, starving the torch tests.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
