package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/client"
)

func init() {
	extraCommands = append(extraCommands, newKVCmd)
}

func newKVCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "kv", Short: "Key-value buckets: put, get, delete, compare-and-set, keys, history, watch"}
	bucket := &cobra.Command{Use: "bucket", Short: "Create, list and delete buckets"}
	bucket.AddCommand(newKVBucketCreateCmd(), newKVBucketListCmd(), newKVBucketDeleteCmd())
	cmd.AddCommand(bucket, newKVPutCmd(), newKVGetCmd(), newKVDelCmd(), newKVCASCmd(), newKVHistoryCmd(), newKVKeysCmd(), newKVWatchCmd())
	return cmd
}

// withKV dials with the global flags and runs fn with a request context.
func withKV(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	c, opts, err := dial(cmd.Context(), cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := withTimeout(cmd.Context(), opts.RequestTimeout)
	defer cancel()
	return fn(ctx, c)
}

func writeJSONLine(out io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}

func newKVBucketCreateCmd() *cobra.Command {
	var history, replicas int
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "create BUCKET",
		Short: "Create a bucket (an identical one is confirmed; a different one is a conflict)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if ttl%time.Millisecond != 0 {
				return fmt.Errorf("--ttl %v is finer than a millisecond", ttl)
			}
			return withKV(cmd, func(ctx context.Context, c *client.Client) error {
				created, err := c.CreateBucket(ctx, client.KVBucketConfig{Bucket: args[0], History: history, TombstoneTTL: ttl, Replicas: replicas})
				if err != nil {
					return err
				}
				if created {
					fmt.Fprintf(cmd.OutOrStdout(), "bucket %s created\n", args[0])
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "bucket %s exists\n", args[0])
				}
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&history, "history", 1, "revisions kept per key (1-64)")
	cmd.Flags().IntVar(&replicas, "replicas", 0, "replicas: 1, 3 or 5 (0 = the broker's default)")
	cmd.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long a deleted key's tombstone is kept before compaction")
	return cmd
}

type kvBucketJSON struct {
	Bucket         string `json:"bucket"`
	History        int    `json:"history"`
	TombstoneTTLMs int64  `json:"tombstone_ttl_ms"`
	Replicas       int    `json:"replicas"`
	Revision       uint64 `json:"revision"`
	Floor          uint64 `json:"floor"`
	Keys           int    `json:"keys"`
	Leader         string `json:"leader"`
}

func newKVBucketListCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [BUCKET]",
		Short: "List buckets (or describe one, as its leader sees it)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withKV(cmd, func(ctx context.Context, c *client.Client) error {
				var infos []client.KVBucketInfo
				if len(args) == 1 {
					info, err := c.Bucket(ctx, args[0])
					if err != nil {
						return err
					}
					infos = append(infos, info)
				} else {
					var err error
					if infos, err = c.Buckets(ctx); err != nil {
						return err
					}
				}
				out := cmd.OutOrStdout()
				if asJSON {
					for _, b := range infos {
						if err := writeJSONLine(out, kvBucketJSON{Bucket: b.Config.Bucket, History: b.Config.History,
							TombstoneTTLMs: b.Config.TombstoneTTL.Milliseconds(), Replicas: b.Config.Replicas,
							Revision: b.Revision, Floor: b.Floor, Keys: b.Keys, Leader: b.Leader}); err != nil {
							return err
						}
					}
					return nil
				}
				w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "BUCKET\tHISTORY\tTTL\tREPLICAS\tREVISION\tFLOOR\tKEYS\tLEADER")
				for _, b := range infos {
					fmt.Fprintf(w, "%s\t%d\t%v\t%d\t%d\t%d\t%d\t%s\n", b.Config.Bucket, b.Config.History, b.Config.TombstoneTTL,
						b.Config.Replicas, b.Revision, b.Floor, b.Keys, b.Leader)
				}
				return w.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}

func newKVBucketDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "delete BUCKET",
		Short: "Delete a bucket and its keys",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withKV(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.DeleteBucket(ctx, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "bucket %s deleted\n", args[0])
				return nil
			})
		},
	}
}

// kvWriteResult prints a write's revision.
func kvWriteResult(cmd *cobra.Command, asJSON bool, key string, rev uint64) error {
	if asJSON {
		return writeJSONLine(cmd.OutOrStdout(), map[string]any{"key": key, "revision": rev})
	}
	_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s revision %d\n", key, rev)
	return err
}

func newKVPutCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "put BUCKET KEY VALUE",
		Short: "Write a value; prints its revision",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withKV(cmd, func(ctx context.Context, c *client.Client) error {
				rev, err := c.KV(args[0]).Put(ctx, args[1], []byte(args[2]))
				if err != nil {
					return err
				}
				return kvWriteResult(cmd, asJSON, args[1], rev)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}

func newKVDelCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "del BUCKET KEY",
		Short: "Delete a key (writes a tombstone); prints its revision",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withKV(cmd, func(ctx context.Context, c *client.Client) error {
				rev, err := c.KV(args[0]).Delete(ctx, args[1])
				if err != nil {
					return err
				}
				return kvWriteResult(cmd, asJSON, args[1], rev)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}

// kvMismatchExit is the exit status of a refused CAS (others exit 1).
const kvMismatchExit = 3

func newKVCASCmd() *cobra.Command {
	var asJSON bool
	var revision uint64
	cmd := &cobra.Command{
		Use:   "cas BUCKET KEY VALUE --revision R",
		Short: "Write a value only if the key's latest revision is R (0: only if the key does not exist)",
		Long: "Write a value only if the key's latest revision is R (0: only if the key does not exist).\n" +
			"A mismatch exits with status 3 and names the key's current revision.",
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("revision") {
				return fmt.Errorf("--revision is required (0 = create only)")
			}
			return withKV(cmd, func(ctx context.Context, c *client.Client) error {
				rev, err := c.KV(args[0]).CAS(ctx, args[1], []byte(args[2]), revision)
				var mismatch *client.RevisionMismatchError
				if errors.As(err, &mismatch) {
					return &exitError{code: kvMismatchExit, msg: fmt.Sprintf("cas %s/%s: revision mismatch: expected %d, current revision is %d",
						args[0], args[1], revision, mismatch.Current)}
				}
				if err != nil {
					return err
				}
				return kvWriteResult(cmd, asJSON, args[1], rev)
			})
		},
	}
	cmd.Flags().Uint64Var(&revision, "revision", 0, "the expected latest revision (0 = the key must not exist)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}

type kvEntryJSON struct {
	Bucket   string `json:"bucket,omitempty"`
	Key      string `json:"key"`
	Revision uint64 `json:"revision"`
	Op       string `json:"op"`
	Value    string `json:"value"`
	TimeMs   int64  `json:"time_ms"`
}

func entryJSON(bucket string, e client.KVEntry) kvEntryJSON {
	op := "put"
	if e.Deleted {
		op = "del"
	}
	return kvEntryJSON{Bucket: bucket, Key: e.Key, Revision: e.Revision, Op: op, Value: string(e.Value), TimeMs: e.Time.UnixMilli()}
}

func printEntry(out io.Writer, asJSON bool, bucket string, e client.KVEntry) error {
	if asJSON {
		return writeJSONLine(out, entryJSON(bucket, e))
	}
	if e.Deleted {
		_, err := fmt.Fprintf(out, "%d\t%s\t(deleted)\n", e.Revision, e.Key)
		return err
	}
	_, err := fmt.Fprintf(out, "%d\t%s\t%s\n", e.Revision, e.Key, e.Value)
	return err
}

func newKVGetCmd() *cobra.Command {
	var asJSON bool
	var revision uint64
	cmd := &cobra.Command{
		Use:   "get BUCKET KEY",
		Short: "Print a key's value (or its revision R with --revision); a missing key exits 1",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withKV(cmd, func(ctx context.Context, c *client.Client) error {
				kv := c.KV(args[0])
				var e client.KVEntry
				var err error
				if revision > 0 {
					e, err = kv.GetRevision(ctx, args[1], revision)
				} else {
					e, err = kv.Get(ctx, args[1])
				}
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSONLine(cmd.OutOrStdout(), entryJSON("", e))
				}
				if e.Deleted {
					_, err = fmt.Fprintf(cmd.OutOrStdout(), "(deleted at revision %d)\n", e.Revision)
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", e.Value)
				return err
			})
		},
	}
	cmd.Flags().Uint64Var(&revision, "revision", 0, "read this revision of the key (while the bucket keeps it)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}

func newKVHistoryCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "history BUCKET KEY",
		Short: "Print a key's kept revisions, oldest first",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withKV(cmd, func(ctx context.Context, c *client.Client) error {
				entries, err := c.KV(args[0]).History(ctx, args[1])
				if err != nil {
					return err
				}
				for _, e := range entries {
					if err := printEntry(cmd.OutOrStdout(), asJSON, "", e); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}

func newKVKeysCmd() *cobra.Command {
	var asJSON bool
	var prefix string
	cmd := &cobra.Command{
		Use:   "keys BUCKET",
		Short: "List the live keys, sorted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withKV(cmd, func(ctx context.Context, c *client.Client) error {
				keys, err := c.KV(args[0]).Keys(ctx, prefix)
				if err != nil {
					return err
				}
				for _, k := range keys {
					if asJSON {
						err = writeJSONLine(cmd.OutOrStdout(), map[string]string{"key": k})
					} else {
						_, err = fmt.Fprintln(cmd.OutOrStdout(), k)
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "only keys that start with this")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}

func newKVWatchCmd() *cobra.Command {
	var asJSON bool
	var prefix string
	var from uint64
	var count int
	cmd := &cobra.Command{
		Use:   "watch BUCKET",
		Short: "Print puts and deletes as they commit, in revision order, until interrupted (or --count)",
		Long: "Print puts and deletes as they commit, in revision order, until interrupted (or --count).\n" +
			"A watch whose next revision fell below the bucket's floor ends with CURSOR_EXPIRED, naming the floor.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd.Context(), cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			w, err := c.KV(args[0]).Watch(cmd.Context(), client.KVWatchOptions{Prefix: prefix, FromRevision: from})
			if err != nil {
				return err
			}
			defer w.Stop()
			seen := 0
			for ev := range w.Events() {
				if err := printEntry(cmd.OutOrStdout(), asJSON, "", ev.Entry); err != nil {
					return err
				}
				if seen++; count > 0 && seen >= count {
					return nil
				}
			}
			if err := w.Err(); err != nil {
				return err
			}
			return cmd.Context().Err()
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "only keys that start with this")
	cmd.Flags().Uint64Var(&from, "from-revision", 0, "first revision to print (0 = from the bucket's start)")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many events (0 = never)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	return cmd
}
