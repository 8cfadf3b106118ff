// podproto reads pods as JSON lines on stdin and writes each as the
// protobuf kube-apiserver would send it (k8s.io/api's Pod.Marshal), each
// behind a 4-byte big-endian length, as in a protobuf watch stream. It
// lets benchmarks/protobuf_probe.py time a Python protobuf reader against
// the JSON path on the same pods without a plane.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		var pod v1.Pod
		if err := json.Unmarshal(in.Bytes(), &pod); err != nil {
			fmt.Fprintln(os.Stderr, "podproto:", err)
			os.Exit(1)
		}
		raw, err := pod.Marshal()
		if err != nil {
			fmt.Fprintln(os.Stderr, "podproto:", err)
			os.Exit(1)
		}
		var size [4]byte
		binary.BigEndian.PutUint32(size[:], uint32(len(raw)))
		out.Write(size[:])
		out.Write(raw)
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "podproto:", err)
		os.Exit(1)
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "podproto:", err)
		os.Exit(1)
	}
}
