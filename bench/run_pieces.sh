#!/usr/bin/env bash
# Moves a run directory to and from a borrowed machine in pieces, so that a long run can be resumed in a
# later sitting (bench/device_check.sh part 10; bench/README.md, "Accelerators"). Each call to such a machine
# carries at most 64 MiB and brings back at most 64 MiB in files of at most 16 MiB, and the users' rodent
# run is about 73 MB (its newest checkpoint 60 MB, already compressed, and its best policy 12 MB). So:
#
#   bash bench/run_pieces.sh pack RUN_DIR STORE             one tar of RUN_DIR, cut into 15 MiB pieces in STORE
#                                                           (STORE/run.tar.part-00, -01, ... and STORE/run.tar.sha256);
#                                                           of its checkpoints/step_* only the newest goes (the one
#                                                           `nnx-ppo resume` starts from; the run keeps two)
#   bash bench/run_pieces.sh take STORE OUT FIRST COUNT     copies pieces FIRST .. FIRST+COUNT-1 and the checksum to OUT
#   bash bench/run_pieces.sh gather PIECES STORE RUN_DIR    adds the pieces in PIECES to STORE; once STORE holds them
#                                                           all (the checksum agrees), unpacks them into RUN_DIR
#                                                           (which must not exist yet) and prints "complete"
#
# On a machine that is held between calls, STORE (under /tmp) lasts, so the pieces can come back over several
# calls (`take`, 4 pieces a call) and go out again over several calls (`gather`, as many as the carry allows).
set -euo pipefail
PIECE=15M
verb=${1:-}
case "$verb" in
  pack)
    run=$2 store=$3
    [ -d "$run" ] || { echo "run_pieces.sh pack: no run directory $run" >&2; exit 2; }
    rm -rf "$store" && mkdir -p "$store"
    older=()  # every step checkpoint but the newest: 60 MB each for the users' preset
    while read -r step; do older+=("--exclude=./checkpoints/$step"); done \
      < <(ls "$run/checkpoints" 2>/dev/null | grep '^step_' | sort | head -n -1)
    tar -c -C "$run" --sort=name "${older[@]}" . | split -b "$PIECE" -d -a 2 - "$store/run.tar.part-"
    cat "$store"/run.tar.part-* | sha256sum | cut -d' ' -f1 > "$store/run.tar.sha256"
    echo "packed $run: $(ls "$store"/run.tar.part-* | wc -l) pieces, $(du -sh "$store" | cut -f1)";;
  take)
    store=$2 out=$3 first=$4 count=$5
    mkdir -p "$out" && cp "$store/run.tar.sha256" "$out/"
    for ((i = first; i < first + count; i++)); do
      piece=$(printf '%s/run.tar.part-%02d' "$store" "$i")
      [ -f "$piece" ] && cp "$piece" "$out/"
    done
    echo "took pieces $first-$((first + count - 1)) of $(ls "$store"/run.tar.part-* | wc -l)";;
  gather)
    pieces=$2 store=$3 run=$4
    [ -e "$run" ] && { echo "run_pieces.sh gather: $run already exists" >&2; exit 2; }
    mkdir -p "$store" && cp -f "$pieces"/run.tar.* "$store/"  # -f: pieces carried in arrive read-only
    have=$(cat "$store"/run.tar.part-* | sha256sum | cut -d' ' -f1)
    if [ "$have" != "$(cat "$store/run.tar.sha256")" ]; then
      echo "gathered $(ls "$store"/run.tar.part-* | wc -l) pieces; the run is not complete yet"; exit 0
    fi
    mkdir -p "$run" && cat "$store"/run.tar.part-* | tar -x -C "$run"
    echo "complete: $run unpacked from $(ls "$store"/run.tar.part-* | wc -l) pieces";;
  *)
    sed -n '2,16p' "$0" >&2; exit 2;;
esac
