"""Silero VAD v5 (npm @ricky0123/vad-web) on speech synthesised with espeak-ng.

  vad.py data DIR                clips of speech between stretches of a quiet room, and the
                                 model's calibration samples (input, state, sr: one folder each)
  vad.py score DIR MODEL [FLOAT] frame accuracy of speech probability >= 0.5 against the truth
                                 (a 32 ms frame is speech where the clean speech's energy there
                                 is within 40 dB of its loudest frame); with the float model, also
                                 the frames whose decision agrees with its and the mean absolute
                                 difference of the probabilities; prints one JSON object

The model runs frame by frame with its state carried, in vaiq's executor.
"""
import json
import os
import sys

import numpy as np

from wakeword import RATE, synthesise

FRAME = 512  # 32 ms at 16 kHz
SENTENCES = ["the weather will be fine tomorrow", "please call me back when you can",
             "seven people came to the meeting", "open the door and let the dog in"]
VOICES = {"calib": [("en-us", 150), ("en-gb+f3", 170)], "eval": [("en-gb-scotland", 160), ("en-us+m3", 130)]}


def clip(text, voice, speed, seed):
    """A clip and its per-frame truth."""
    audio = synthesise(text, voice, speed, seed)  # 1 s of room, the speech, 1 s of room
    clean = np.zeros_like(audio)
    clean[RATE:audio.size - RATE] = audio[RATE:audio.size - RATE]
    frames = audio.size // FRAME
    energy = np.array([np.mean(clean[f * FRAME:(f + 1) * FRAME] ** 2) for f in range(frames)])
    truth = energy >= energy.max() * 1e-4
    return (audio[:frames * FRAME] / 32768.0).astype(np.float32), truth


def make_data(directory):
    for split, voices in VOICES.items():
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        k = 0
        for v, (voice, speed) in enumerate(voices):
            for s, text in enumerate(SENTENCES):
                audio, truth = clip(text, voice, speed, 10 * v + s + (0 if split == "calib" else 500))
                np.save(os.path.join(directory, split, f"clip_{k:02d}.npy"), audio)
                np.save(os.path.join(directory, split, f"truth_{k:02d}.npy"), truth)
                k += 1
    # Calibration samples: frames of the calibration clips with the state the float model carries there.
    import vaiq
    model = os.environ["VAD_MODEL"]
    n = 0
    for f in sorted(os.listdir(os.path.join(directory, "calib"))):
        if not f.startswith("clip_"):
            continue
        audio = np.load(os.path.join(directory, "calib", f))
        state = np.zeros((2, 1, 128), np.float32)
        for i in range(audio.size // FRAME):
            frame = audio[None, i * FRAME:(i + 1) * FRAME]
            if i % 8 == 0:
                sample = os.path.join(directory, "calib_samples", f"{n:04d}")
                os.makedirs(sample, exist_ok=True)
                np.save(os.path.join(sample, "input.npy"), frame)
                np.save(os.path.join(sample, "state.npy"), state)
                np.save(os.path.join(sample, "sr.npy"), np.array(RATE, np.int64))
                n += 1
            _, state = vaiq.infer(model, {"input": frame, "state": state, "sr": np.array(RATE, np.int64)}, threads=1)


def probabilities(directory, model):
    """Each evaluation clip's speech probabilities and truth, frame by frame."""
    import vaiq
    out = []
    for f in sorted(os.listdir(os.path.join(directory, "eval"))):
        if not f.startswith("clip_"):
            continue
        audio = np.load(os.path.join(directory, "eval", f))
        truth = np.load(os.path.join(directory, "eval", f.replace("clip_", "truth_")))
        state = np.zeros((2, 1, 128), np.float32)
        p = np.zeros(truth.size)
        for i in range(truth.size):
            frame = audio[None, i * FRAME:(i + 1) * FRAME]
            q, state = vaiq.infer(model, {"input": frame, "state": state, "sr": np.array(RATE, np.int64)}, threads=1)
            p[i] = float(q.reshape(-1)[0])
        out.append((p, truth))
    return out


def score(directory, model, reference=None):
    p = probabilities(directory, model)
    right = sum(int(np.sum((q >= 0.5) == t)) for q, t in p)
    total = sum(t.size for _, t in p)
    result = {"metric": round(100.0 * right / total, 1), "frames": total}
    if reference:
        f = probabilities(directory, reference)
        result["decisions_agree"] = round(100.0 * sum(int(np.sum((q >= 0.5) == (r >= 0.5))) for (q, _), (r, _) in
                                                      zip(p, f)) / total, 1)
        result["mean_abs_diff"] = round(float(np.mean(np.concatenate([np.abs(q - r) for (q, _), (r, _) in zip(p, f)]))), 4)
    return result


if __name__ == "__main__":
    if sys.argv[1] == "data":
        make_data(sys.argv[2])
    elif sys.argv[1] == "score":
        print(json.dumps(score(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)))
    else:
        sys.exit(__doc__)
