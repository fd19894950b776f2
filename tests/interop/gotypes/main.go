// gotypes converts CNI results with the Go reference's own code, so the Python spec
// types can be checked against it. One JSON request per stdin line:
//
//	{"result": <result JSON>, "to": "0.4.0"}
//
// and one answer per line: {"result": <converted JSON>} or {"error": "..."}.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"github.com/containernetworking/cni/pkg/types/create"
	// The result types register their creators and converters when imported.
	_ "github.com/containernetworking/cni/pkg/types/020"
	_ "github.com/containernetworking/cni/pkg/types/040"
	_ "github.com/containernetworking/cni/pkg/types/100"
)

type request struct {
	Result json.RawMessage `json:"result"`
	To     string          `json:"to"`
}

type answer struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

func convert(req request) answer {
	ver, err := create.DecodeVersion(req.Result)
	if err != nil {
		return answer{Error: err.Error()}
	}
	res, err := create.Create(ver, req.Result)
	if err != nil {
		return answer{Error: err.Error()}
	}
	out, err := res.GetAsVersion(req.To)
	if err != nil {
		return answer{Error: err.Error()}
	}
	// json.Marshal on the result value behaves as PrintTo (which indents the same bytes).
	data, err := json.Marshal(out)
	if err != nil {
		return answer{Error: err.Error()}
	}
	return answer{Result: data}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	enc := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var ans answer
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			ans = answer{Error: fmt.Sprintf("bad request: %v", err)}
		} else {
			ans = convert(req)
		}
		if err := enc.Encode(ans); err != nil {
			os.Exit(1)
		}
	}
}
