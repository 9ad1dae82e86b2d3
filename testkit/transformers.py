"""The tiny transformers the tests train and compare across runtimes: one of each style, small
enough for float64 references, with more learned positions than the sequences they read."""
from workloads.models import Transformer

GPT2 = Transformer("tiny-gpt2", vocab=64, context=16, width=32, depth=2, heads=4, ffn=64)
LLAMA = Transformer("tiny-llama", vocab=64, context=16, width=32, depth=2, heads=4, ffn=48,
                    style="llama", tied=False)
STYLES = {"gpt2": GPT2, "llama": LLAMA}
CLASSES = 3
B, T = 4, 12        # shorter than the context: gpt2 reads the first T learned positions
