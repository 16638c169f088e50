"""openWakeWord's three stages on speech synthesised with espeak-ng.

The pipeline (as the package runs it): 16 kHz audio -> melspectrogram.onnx
(32 mel bands, then x / 10 + 2) -> embedding_model.onnx (windows of 76 frames,
every 8th frame: one 96-value embedding per 80 ms) -> a keyword model (the last
16 embeddings, 34 for timer) -> a score; a clip is a detection where its best
window scores 0.5 or more (for timer: 1 - P(no timer)).

  wakeword.py data DIR           clips, and each stage's calibration inputs
  wakeword.py score MODELS_DIR DIR STAGE [QUANTIZED.onnx]
      per keyword, over the evaluation clips: the AUC of the clips' best window
      scores (positives against every other clip: the task metric, as espeak-ng's
      voices are not the ones the models were trained on), and the detections and
      false alarms at 0.5; with STAGE (melspectrogram, embedding_model or a
      keyword model) replaced by QUANTIZED.onnx. A front-end stage is scored as the
      mean over the keyword models but hey_jarvis (whose graph takes one window a
      run). Prints one JSON object.

Ground truth: a clip is positive for the keyword its phrase says. Evaluation
clips use other voices and speeds than the calibration clips.
"""
import json
import os
import subprocess
import sys
import tempfile
import wave

import numpy as np

KEYWORDS = {
    "alexa_v0.1": ["alexa", "alexa, what time is it", "hey alexa"],
    "hey_jarvis_v0.1": ["hey jarvis", "hey jarvis, lights on", "okay, hey jarvis"],
    "hey_mycroft_v0.1": ["hey mycroft", "hey mycroft, play music", "well, hey mycroft"],
    "hey_rhasspy_v0.1": ["hey rhasspy", "hey rhasspy, stop", "hey rhasspy, what's up"],
    "timer_v0.1": ["set a timer for five minutes", "set a ten minute timer", "start a one hour timer"],
    "weather_v0.1": ["what's the weather", "what is the weather like today", "tell me the weather"],
}
NEGATIVES = [
    "good morning everyone", "please open the window", "the quick brown fox jumps",
    "I would like a cup of tea", "turn left at the next corner", "my computer is very slow",
    "we met at the station", "the meeting starts at noon", "this is a test recording",
    "can you hear me now", "the river flows to the sea", "seven eight nine ten",
]
CALIBRATION_VOICES = [("en-us", 150), ("en-gb", 170), ("en-us+f3", 140)]
# Twelve voices: with four (12 positive clips a keyword) the AUC's standard error was 5-7 points,
# more than the differences between recipes it was read for.
EVALUATION_VOICES = [("en-gb-scotland", 160), ("en-us+m3", 130), ("en-029+f2", 175), ("en-gb-x-rp+f4", 150),
                     ("en-gb-x-gbclan", 145), ("en-gb-x-gbcwmd+m2", 165), ("en-us-nyc", 155), ("en-us+f2", 135),
                     ("en-gb+m7", 180), ("en-029+m1", 140), ("en-gb-scotland+f1", 150), ("en-us+m5", 170)]
RATE = 16000
FRONT_END = ("melspectrogram", "embedding_model")
WINDOWS = (16, 22, 34)  # the keyword models' embeddings a window: 16, weather 22, timer 34


def synthesise(text, voice, speed, seed):
    with tempfile.TemporaryDirectory() as tmp:
        raw, out = os.path.join(tmp, "a.wav"), os.path.join(tmp, "b.wav")
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", raw, text], check=True)
        subprocess.run(["sox", "-D", raw, "-r", str(RATE), "-c", "1", "-b", "16", out], check=True)
        with wave.open(out) as w:
            speech = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32)
    rng = np.random.default_rng(seed)
    pad = lambda n: rng.normal(0, 30, n).astype(np.float32)  # a quiet room, in int16 units
    return np.concatenate([pad(RATE), speech * 0.7, pad(RATE)])


def clips(voices, seed):
    out = []
    for v, (voice, speed) in enumerate(voices):
        for keyword, phrases in KEYWORDS.items():
            for p, text in enumerate(phrases):
                out.append((keyword, synthesise(text, voice, speed, seed + 100 * v + p)))
        for p, text in enumerate(NEGATIVES):
            out.append((None, synthesise(text, voice, speed, seed + 1000 * v + p)))
    return out


def infer(model, feeds):
    import vaiq
    return vaiq.infer(model, feeds, threads=1)


def mel(model, audio):
    spec = infer(model, {"input": audio[None, :]})[0]  # [time, 1, frames, 32]
    return spec[:, 0].reshape(-1, 32) / 10.0 + 2.0


def windows(spec):
    starts = range(0, spec.shape[0] - 76 + 1, 8)
    return np.stack([spec[s:s + 76] for s in starts])[:, :, :, None].astype(np.float32)


def embed(model, spec):
    return infer(model, {"input_1": windows(spec)})[0].reshape(-1, 96)


def batched(model, directory):
    """A copy of a keyword model whose batch dimension is free (the exports fix it
    at 1), so that every window of a clip is scored in one run; its input name
    and window length."""
    import onnx
    m = onnx.load(model)
    value = m.graph.input[0]
    value.type.tensor_type.shape.dim[0].dim_param = "windows"
    for out in m.graph.output:
        out.type.tensor_type.shape.dim[0].dim_param = "windows"
    path = os.path.join(directory, os.path.basename(model))
    onnx.save(m, path)
    return (path, model), value.name, value.type.tensor_type.shape.dim[1].dim_value


def score(head, embeddings):
    (model, original), name, length = head
    if embeddings.shape[0] < length:
        return 0.0
    stack = np.stack([embeddings[end - length:end] for end in range(length, embeddings.shape[0] + 1)])
    try:
        out = infer(model, {name: stack.astype(np.float32)})[0]
    except ValueError:  # a model whose graph needs its batch of one (hey_jarvis' If)
        out = np.concatenate([infer(original, {name: w[None].astype(np.float32)})[0] for w in stack])
    return float((1.0 - out[:, 0]).max() if out.shape[1] > 1 else out[:, 0].max())


def auc(positive, negative):
    """The chance that a positive clip outscores a negative one (ties count half)."""
    p, n = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float(((p > n) + 0.5 * (p == n)).mean())


def auc_standard_error(a, positives, negatives):
    """Hanley and McNeil's standard error of an AUC `a` over that many clips."""
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    v = a * (1 - a) + (positives - 1) * (q1 - a * a) + (negatives - 1) * (q2 - a * a)
    return float(np.sqrt(max(v, 0.0) / (positives * negatives)))


def make_data(directory):
    import vaiq  # noqa: F401  (fail early when the module is not on the path)
    models = os.environ["OWW_MODELS"]
    os.makedirs(directory, exist_ok=True)
    for split, voices, seed in (("calibration", CALIBRATION_VOICES, 1), ("evaluation", EVALUATION_VOICES, 2)):
        data = clips(voices, seed)
        np.save(os.path.join(directory, f"{split}_labels.npy"), np.array([k or "" for k, _ in data]))
        for i, (_, audio) in enumerate(data):
            np.save(os.path.join(directory, f"{split}_{i:03d}.npy"), audio)
    # Calibration inputs of each stage, from the float stages before it: 1 s of
    # audio, mel windows, embedding sequences, each over the clip's speech (a
    # clip is 1 s of a quiet room, the phrase, 1 s of room: windows drawn
    # anywhere were mostly room, and a keyword model's scores there all 1e-7).
    calib = [np.load(os.path.join(directory, f)) for f in sorted(os.listdir(directory))
             if f.startswith("calibration_") and f[-7:-4].isdigit()]
    for stage in ("melspectrogram", "embedding_model") + tuple(f"keywords_{n}" for n in WINDOWS):
        os.makedirs(os.path.join(directory, "calib", stage), exist_ok=True)
    rng = np.random.default_rng(5)
    n = 0
    for i, audio in enumerate(calib):
        speech = audio.size / RATE - 2.0  # seconds
        s = int(rng.integers(RATE // 2, max(RATE // 2 + 1, audio.size - RATE - RATE // 2)))
        np.save(os.path.join(directory, "calib", "melspectrogram", f"{i:03d}.npy"), audio[None, s:s + RATE])
        spec = mel(os.path.join(models, "melspectrogram.onnx"), audio)
        w = windows(spec)
        # Mel window j covers frames 8j..8j+76 (10 ms each); the speech frames 100..100+100*speech.
        first, last = max(0, (100 - 60) // 8), min(w.shape[0], int((100 + 100 * speech) // 8) + 1)
        for j in rng.choice(np.arange(first, last), size=min(2, last - first), replace=False):
            np.save(os.path.join(directory, "calib", "embedding_model", f"{n:04d}.npy"), w[j:j + 1])
            n += 1
        e = embed(os.path.join(models, "embedding_model.onnx"), spec)
        for length in WINDOWS:
            if e.shape[0] >= length:
                # Embedding k covers 80k ms .. 80k + 760 ms: windows that end as the phrase
                # has ended, where a detector decides.
                done = int(round((speech + 0.24) / 0.08)) + 1
                end = int(np.clip(done + rng.integers(-2, 3), length, e.shape[0]))
                np.save(os.path.join(directory, "calib", f"keywords_{length}", f"{i:03d}.npy"),
                        e[None, end - length:end].astype(np.float32))


def float_embeddings(models, directory, files):
    """The float front end's embeddings of the evaluation clips, computed once."""
    cache = os.path.join(directory, "float_embeddings.npz")
    if not os.path.exists(cache):
        front = lambda f: embed(os.path.join(models, "embedding_model.onnx"),
                                mel(os.path.join(models, "melspectrogram.onnx"), np.load(os.path.join(directory, f))))
        np.savez(cache, *[front(f) for f in files])
    stored = np.load(cache)
    return [stored[f"arr_{i}"] for i in range(len(files))]


def evaluate(models, directory, stage, quantized):
    path = lambda name: quantized if name == stage and quantized else os.path.join(models, name + ".onnx")
    labels = np.load(os.path.join(directory, "evaluation_labels.npy"))
    files = sorted(f for f in os.listdir(directory) if f.startswith("evaluation_") and f[-7:-4].isdigit())
    # The front end is scored through the keyword models that take a batch of windows (hey_jarvis'
    # graph needs one window a run: 40 runs a clip); each keyword model on its own clips.
    keywords = [k for k in KEYWORDS if k != "hey_jarvis_v0.1"] if stage in FRONT_END else [stage]
    scores = {k: [] for k in keywords}
    front = [embed(path("embedding_model"), mel(path("melspectrogram"), np.load(os.path.join(directory, f))))
             for f in files] if stage in FRONT_END else float_embeddings(
                 models, directory, files)
    with tempfile.TemporaryDirectory() as tmp:
        heads = {k: batched(path(k), tmp) for k in keywords}
        for e in front:
            for k in keywords:
                scores[k].append(score(heads[k], e))
    result = {}
    for k in keywords:
        s = np.array(scores[k])
        positive = labels == k
        a = auc(s[positive], s[~positive])
        result[k] = {"auc": round(100 * a, 1),
                     "auc_standard_error": round(100 * auc_standard_error(a, positive.sum(), (~positive).sum()), 1),
                     "detected": round(100 * float((s[positive] >= 0.5).mean()), 1),
                     "false_alarms": round(100 * float((s[~positive] >= 0.5).mean()), 1)}
    # The task metric: how well the scores separate each keyword's clips from the rest.
    result["metric"] = round(float(np.mean([r["auc"] for r in result.values()])), 1)
    return result


if __name__ == "__main__":
    if sys.argv[1] == "data":
        make_data(sys.argv[2])
    elif sys.argv[1] == "score":
        print(json.dumps(evaluate(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)))
    else:
        sys.exit(__doc__)
