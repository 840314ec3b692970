"""gemma4: gemma4.h (Gemma 4 exactly as transformers computes it) from Python, numpy in and out.

    import gemma4
    m = gemma4.Model("data/tiny/e2b_like")          # a checkpoint directory
    logits = m.logits([2, 818, 1010])               # float32 [S, V]
    taps = m.taps([2, 818, 1010])                   # {"layers.3.self_attn.q": [S, cols], ...}
    loss, grads = m.loss_and_grad([2, 818, 1010])   # grads by checkpoint tensor name
    new = m.generate([2, 818], 8)                   # greedy, or temperature=..., top_p=..., seed=...
    s = m.session(max_context=256)                  # incremental decoding, its own arena
    tok = gemma4.Tokenizer("path/to/checkpoint")     # tokenizer.json
    soft = m.encode_image(pixel_values, positions)  # or m.encode_audio(*gemma4.audio_features(pcm))
    logits = m.logits(ids_with_placeholders, soft=soft)

The library is built from gemma4.h with the system C compiler when the package
is installed (pip install ./python) and bound with ctypes; every call releases
the GIL. Errors are gemma4.Error (InputError for bad arguments, LoadError for
files) carrying the library's message. The torch bridge (compare_forward,
compare_grads) is gemma4.torch, imported only on request.
"""

from ._core import Error, InputError, LoadError, Model, Sampler, Session, audio_features, read_wav, simd_name
from ._text import ChatTemplate, Tokenizer, load_chat_template

__version__ = "0.1.0"
__all__ = ["Model", "Session", "Sampler", "Tokenizer", "ChatTemplate", "load_chat_template", "Error",
           "InputError", "LoadError", "simd_name", "audio_features", "read_wav"]
