console.log("app v1");
