// Command hello is the smallest program that uses the client: one check
// against a node, printed. TestHelloWorldBinarySize builds it to keep the
// client small.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/sluicehq/sluice/client"
)

func main() {
	c, err := client.New([]string{"localhost:8081"}, client.WithCallTimeout(time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer c.Close()
	res, err := c.Check(context.Background(), client.Request{Name: "hello", Key: "world", Limit: 10, Window: time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(res)
}
