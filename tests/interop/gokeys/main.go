// gokeys decodes JSON objects into a struct with Go's encoding/json, so pycni's key matching
// (pycni.spec.gokeys) can be compared with the real thing, case by case.
//
//	gokeys < cases.json   (a JSON array of objects) -> a JSON array of the decoded structs
//
// The fields cover what the rule depends on: names with and without the specially folding
// letters k and s, with punctuation, an int, a list, a nested struct and a map (merged when
// given twice), and the field names of the CNI capabilities.
package main

import (
	"encoding/json"
	"fmt"
	"os"
)

type Inner struct {
	A string `json:"a"`
	B string `json:"b"`
}

type Fields struct {
	Mac            string            `json:"mac"`
	Mask           string            `json:"mask"`
	IPs            []string          `json:"ips"`
	HostPort       int               `json:"hostPort"`
	Inner          Inner             `json:"inner"`
	Labels         map[string]string `json:"labels"`
	PodAnnotations map[string]string `json:"io.kubernetes.cri.pod-annotations"`
	Attachments    string            `json:"cni.dev/valid-attachments"`
	InfinibandGUID string            `json:"infinibandGUID"`
}

func main() {
	var cases []json.RawMessage
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		fmt.Fprintln(os.Stderr, "gokeys:", err)
		os.Exit(1)
	}
	out := make([]Fields, len(cases))
	for i, c := range cases {
		if err := json.Unmarshal(c, &out[i]); err != nil {
			fmt.Fprintln(os.Stderr, "gokeys: case", i, err)
			os.Exit(1)
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "gokeys:", err)
		os.Exit(1)
	}
}
