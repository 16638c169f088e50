'use strict';
// Runs one ONNX model in ONNX Runtime (CPU) on .npy inputs and writes its
// outputs as .npy: what vaiq's integration tests use to check that quantized
// models work where users deploy them.
//
//   node run_model.js MODEL OUT_DIR [--optimized FILE] [--level LEVEL] INPUT.npy...
//
// Input i binds to the model's input i. Output i is written as OUT_DIR/output_<i>.npy.
// --optimized writes the graph ONNX Runtime runs after its optimizations;
// --level sets its graph optimization level (default 'all').
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

const TYPES = {  // numpy descr -> [ORT type, array type]
  '<f4': ['float32', Float32Array], '|u1': ['uint8', Uint8Array], '|i1': ['int8', Int8Array],
  '<i8': ['int64', BigInt64Array], '<i4': ['int32', Int32Array], '<f2': ['float16', Uint16Array],
  '|b1': ['bool', Uint8Array],
};

function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.toString('latin1', 1, 6) !== 'NUMPY') throw new Error(`${file}: not a .npy file`);
  const major = buf.readUInt8(6);
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12);
  const header = buf.toString('latin1', start, start + headerLen);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map((s) => s.trim()).filter((s) => s).map(Number);
  if (/'fortran_order':\s*True/.test(header)) throw new Error(`${file}: Fortran order is not supported`);
  const type = TYPES[descr];
  if (!type) throw new Error(`${file}: unsupported dtype ${descr}`);
  const body = buf.subarray(start + headerLen);
  const data = new type[1](body.buffer.slice(body.byteOffset, body.byteOffset + body.length));
  return new ort.Tensor(type[0], data, shape);
}

function writeNpy(file, tensor) {
  const descr = Object.keys(TYPES).find((d) => TYPES[d][0] === tensor.type);
  if (!descr) throw new Error(`cannot write ${tensor.type} outputs`);
  const shape = tensor.dims.length === 1 ? `(${tensor.dims[0]},)` : `(${tensor.dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  header += ' '.repeat(63 - ((header.length + 10) % 64)) + '\n';
  const prefix = Buffer.alloc(10);
  prefix.writeUInt8(0x93, 0);
  prefix.write('NUMPY', 1, 'latin1');
  prefix.writeUInt8(1, 6);
  prefix.writeUInt8(0, 7);
  prefix.writeUInt16LE(header.length, 8);
  const data = Buffer.from(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
  fs.writeFileSync(file, Buffer.concat([prefix, Buffer.from(header, 'latin1'), data]));
}

async function main() {
  const args = process.argv.slice(2);
  const optimized = args.indexOf('--optimized');
  let optimizedFile = null;
  if (optimized >= 0) {
    optimizedFile = args[optimized + 1];
    args.splice(optimized, 2);
  }
  const levelAt = args.indexOf('--level');
  let level = 'all';
  if (levelAt >= 0) {
    level = args[levelAt + 1];
    args.splice(levelAt, 2);
  }
  const [model, outDir, ...inputs] = args;
  if (!model || !outDir || inputs.length === 0) {
    throw new Error('usage: node run_model.js MODEL OUT_DIR [--optimized FILE] [--level LEVEL] INPUT.npy...');
  }
  const options = { executionProviders: ['cpu'], graphOptimizationLevel: level, intraOpNumThreads: 1 };
  if (optimizedFile) options.optimizedModelFilePath = optimizedFile;
  const session = await ort.InferenceSession.create(model, options);
  const feeds = {};
  session.inputNames.forEach((name, i) => { feeds[name] = readNpy(inputs[i]); });
  const results = await session.run(feeds);
  fs.mkdirSync(outDir, { recursive: true });
  session.outputNames.forEach((name, i) => writeNpy(path.join(outDir, `output_${i}.npy`), results[name]));
}

main().catch((e) => {
  console.error(`error: ${e.message}`);
  process.exit(1);
});
