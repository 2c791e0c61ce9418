#!/usr/bin/env bash
# The CUDA figures of bench/README.md, made on a GPU machine that reaches no network: everything
# it needs is carried to it from a machine that does.
#
#   bash bench/cuda.sh prepare DIR   # here (network): DIR/1 and DIR/2, the two loads to carry
#   bash bench/cuda.sh build DIR/1   # there: build llama-cpp-python with CUDA, install the rest
#   bash bench/cuda.sh bench DIR/2 [SECONDS]  # there, same machine: the benches
#
# Logs and results go to $OUT (default bench/results/cuda).
#
# Two loads because a transfer is capped below SmolLM2 Q4_1's 98 MB: load 1 carries the
# llama-cpp-python source (stripped of llama.cpp's docs, model vocabularies, tests and git
# history: 5.5 MB compressed), the wheels the machine lacks and the model's first part; load 2
# the model's rest. The Q8_0 copy and the padded target are derived there, by the same code as
# here (devtools/realmodels.py). The build compiles for compute capability 9.0 (Hopper) with
# llama.cpp's default flash-attention kernels (K/V types f16-f16, q8_0-q8_0, q4_0-q4_0,
# bf16-bf16: what a stock CUDA build of llama-cpp-python has).
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?prepare, build or bench}
dir=${2:?a folder}
work=/tmp/modelhub-cuda  # kept between the two calls on the same machine
out=${OUT:-bench/results/cuda}  # logs and results
mkdir -p "$out"
version=$(sed -n 's/^VERSION = "\(.*\)".*/\1/p' devtools/llama_wheel.py)
split=44000000  # bytes of the model in load 1

# What modelhub, its benches and the build need, fetched with their dependencies for the GPU
# machine's Python (3.12); the wheels of what its image already holds are then left out.
wanted="fastapi uvicorn platformdirs gguf>=0.17 prompt-toolkit>=3.0.40 miniaudio python-multipart
diskcache pydantic>=2 scikit-build-core"
held="numpy pyyaml requests urllib3 idna certifi charset_normalizer click h11 tqdm packaging
pathspec annotated_doc"

prepare() {
  mkdir -p "$dir/1/wheels" "$dir/2"
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-"$version".tar.gz -C "$tmp"
  local src=$tmp/llama_cpp_python-$version
  rm -rf "$src"/{.git,.github,docs,examples,tests}
  (cd "$src/vendor/llama.cpp" && rm -rf .git .github .devops models docs media benches tests \
    examples tools/ui tools/server gguf-py conversion)
  tar cJf "$dir/1/llama-src.tar.xz" -C "$tmp" "llama_cpp_python-$version"
  # shellcheck disable=SC2086  # the lists are meant to split
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dir/1/wheels" $wanted
  for name in $held; do rm -f "$dir/1/wheels/$name"-*.whl; done
  local model
  model=$(.venv/bin/python -c 'from devtools import realmodels; print(realmodels.smollm2_q4_1())')
  head -c "$split" "$model" >"$dir/1/smollm2.part-a"
  tail -c +"$((split + 1))" "$model" >"$dir/2/smollm2.part-b"
  rm -rf "$tmp"
  du -sh "$dir"/1 "$dir"/2
}

# CMake options for a CUDA toolkit assembled from Python packages, as on images that hold
# PyTorch: cuBLAS from PyTorch's nvidia-cublas (nvidia/cu13/{include,lib}, versioned .so files
# only) and the driver library from the driver's own folder, each linked into a folder of their
# own (with cuBLAS's headers alone, so no other header of that package shadows the toolkit's);
# without a driver library to link, no virtual-memory pool (GGML_CUDA_NO_VMM). Prints nothing
# where the toolkit has both.
cuda_args() {
  local toolkit=${CUDA_HOME:-/usr/local/cuda} shim=$work/cuda-shim
  mkdir -p "$shim/lib" "$shim/include"
  if ! compgen -G "$toolkit/lib64/libcublas.so*" >/dev/null; then
    local lib roots libdir
    roots=$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null || echo /)
    # shellcheck disable=SC2086  # several folders
    lib=$(find $roots -name 'libcublas.so.*' 2>/dev/null | sort | head -1)
    [ -n "$lib" ] || { echo "no cuBLAS in $toolkit nor in a Python package" >&2; return 1; }
    libdir=$(dirname "$lib")
    ln -sf "$libdir"/libcublas.so.* "$shim/lib/libcublas.so"
    ln -sf "$libdir"/libcublasLt.so.* "$shim/lib/libcublasLt.so"
    ln -sf "$(dirname "$libdir")"/include/cublas*.h "$shim/include/"
    echo "-DCUDA_cublas_LIBRARY=$shim/lib/libcublas.so"
    echo "-DCUDA_cublasLt_LIBRARY=$shim/lib/libcublasLt.so"
    echo "-DCMAKE_CUDA_FLAGS=-I$shim/include -DCMAKE_CXX_FLAGS=-I$shim/include"
  fi
  if ! compgen -G "$toolkit/lib64/stubs/libcuda.so" >/dev/null; then
    local driver
    driver=$(ldconfig -p | sed -n 's/.*libcuda\.so\.1 .*=> //p' | head -1)
    [ -n "$driver" ] || driver=$(find /usr/local/nvidia /usr/lib* -name 'libcuda.so.1' 2>/dev/null | head -1)
    if [ -n "$driver" ]; then
      ln -sf "$driver" "$shim/lib/libcuda.so"
      echo "-DCUDA_cuda_driver_LIBRARY=$shim/lib/libcuda.so"
    else
      echo "-DGGML_CUDA_NO_VMM=ON"
    fi
  fi
}

# Where the libraries the CUDA build links against are found at run time.
cuda_library_path() {
  local dirs=${CUDA_HOME:-/usr/local/cuda}/lib64
  [ -e "$work/cuda-shim/lib/libcublas.so" ] \
    && dirs=$(dirname "$(readlink -f "$work/cuda-shim/lib/libcublas.so")"):$dirs
  echo "$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

build() {
  mkdir -p "$work/site" "$work/cache"
  export PATH=$PATH:${CUDA_HOME:-/usr/local/cuda}/bin
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$work/site" "$dir"/wheels/*.whl
  cp "$dir/smollm2.part-a" "$work/"
  tar xJf "$dir/llama-src.tar.xz" -C "$work"
  export PYTHONPATH=$work/site
  local start=$SECONDS extra
  extra=$(cuda_args | tr '\n' ' ')
  echo "CMake options for this toolkit: ${extra:-none}"
  CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 $extra" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip wheel -q --no-build-isolation --no-deps \
    -w "$work/wheel" "$work/llama_cpp_python-$version" >"$out/build.log" 2>&1 \
    || { tail -60 "$out/build.log"; exit 1; }
  echo "llama-cpp-python $version with CUDA: built in $((SECONDS - start)) s on $(nproc) cores"
  python3 -m pip install -q --no-index --no-deps --target "$work/site" "$work"/wheel/*.whl
  LD_LIBRARY_PATH=$(cuda_library_path) python3 -c \
    'import llama_cpp; print("GPU offload:", llama_cpp.llama_supports_gpu_offload())'
}

bench() {
  local budget=${1:-450}  # seconds for the four benches together
  export PYTHONPATH=$work/site:$PWD MODELHUB_TEST_CACHE=$work/cache PYTHONUNBUFFERED=1
  LD_LIBRARY_PATH=$(cuda_library_path)
  export LD_LIBRARY_PATH
  mkdir -p "$work/cache"
  cat "$work/smollm2.part-a" "$dir/smollm2.part-b" >"$work/cache/SmolLM2-135M-Instruct.Q4_1.gguf"
  python3 -c 'from devtools import realmodels as r; r.smollm2_q8_0(); r.padded_smollm2()'
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
  local threads=8 status=0
  # Each bench under its own share of the budget, the most telling first, so that one that runs
  # long still leaves the others their time; what each printed is in $out.
  timeout $((budget * 10 / 100)) python3 bench/exactness.py --kv auto f16 \
    --json "$out/exactness.json" 2>&1 | tee "$out/exactness.log" || status=1
  timeout $((budget * 45 / 100)) python3 bench/speculative.py --sections acei --runs 2 \
    --tokens 128 --threads "$threads" --json "$out/speculative.json" 2>&1 \
    | tee "$out/speculative.log" || status=1
  timeout $((budget * 35 / 100)) python3 bench/serving.py --concurrency --repeats 1 --prompts 2 \
    --threads "$threads" --out "$out/serving.json" 2>&1 | tee "$out/serving.log" || status=1
  # (auto is F16 where the layers are on a GPU since these figures: both columns are F16 now)
  timeout $((budget * 10 / 100)) python3 bench/kvcache.py --runs 1 --threads "$threads" \
    --json "$out/kvcache.json" 2>&1 | tee "$out/kvcache.log" || status=1
  return $status
}

"$stage" "${@:3}"
