"""Small random inputs for each real model (tests/models/fetch.py), for backend checks that
compare two runtimes on the same values."""
import numpy as np

RANDOM_FEEDS = {
    "ppocr_det": lambda rng: {"x": rng.standard_normal((1, 3, 160, 192)).astype(np.float32)},
    "ppocr_rec": lambda rng: {"x": rng.standard_normal((1, 3, 48, 160)).astype(np.float32)},
    "ppocr_cls": lambda rng: {"x": rng.standard_normal((1, 3, 48, 192)).astype(np.float32)},
    "yolov8n": lambda rng: {"images": rng.random((1, 3, 320, 320), dtype=np.float32)},
    "minilm_int8": lambda rng: {"input_ids": rng.integers(1000, 30000, (1, 32)).astype(np.int64),
                                "attention_mask": np.ones((1, 32), np.int64),
                                "token_type_ids": np.zeros((1, 32), np.int64)},
    "silero_vad": lambda rng: {"input": rng.standard_normal((1, 512)).astype(np.float32) * 0.1,
                               "state": rng.standard_normal((2, 1, 128)).astype(np.float32) * 0.1,
                               "sr": np.array(16000, np.int64)},
}
