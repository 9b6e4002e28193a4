// The types of support.mjs, for the TypeScript suites.
export declare const url: string;
export declare const token: string;
export declare const account: string;
export declare const connection: { url: string; token: string };
export declare const d1ReadToken: string;
export declare const bucketToken: string;
export declare const limitedBucket: string;
export declare function unique(prefix: string): string;
export declare function v4(method: string, path: string, body?: unknown): Promise<any>;
export declare function createDatabase(prefix: string): Promise<{ uuid: string; name: string }>;
export declare function createBucket(prefix: string): Promise<string>;
export declare function rejection(promise: Promise<unknown>): Promise<any>;
